"""A job with every part of tunecache on, for tests/test_process_owner.py: activated by
its environment alone (TUNECACHE_DB and a signing key; no tunecache code), it runs a
user's @triton.autotune kernel under Triton's interpreter and compiles a bmm with real
max-autotune on the CPU, then writes the parts that were on.

    python process_owner_worker.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch  # first, as in a job: importing it runs tunecache's autoload hook
import triton
import triton.language as tl


def cpu_bench(kernel_call, quantiles):  # type: ignore[no-untyped-def]
    """Under the interpreter a kernel's own do_bench times it (no GPU driver)."""
    kernel_call()
    return [1.0, 1.0, 1.0]


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (64, 128)], key=["n"],
                 do_bench=cpu_bench, restore_value=["out"])
@triton.jit
def add_into(out, x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(out + offs, mask=mask) + tl.load(x + offs, mask=mask),
             mask=mask)


def main(out_path: str) -> None:
    n = 300
    x, out = torch.arange(n, dtype=torch.float32), torch.ones(n)
    add_into[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](out, x, n)

    def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)

    a, b = torch.randn(2, 64, 32), torch.randn(2, 32, 48)
    compiled = torch.compile(bmm, mode="max-autotune-no-cudagraphs", dynamic=False)
    same = torch.allclose(compiled(a, b), bmm(a, b), atol=1e-4)

    import tunecache
    from tunecache.switch import parts_on

    Path(out_path).write_text(json.dumps({
        "parts": parts_on(), "correct": same and bool(torch.equal(out, x + 1)),
        "gemm_lookups": len(tunecache.stats().gemm.events),
        "user_kernels_tuned": tunecache.stats().user_kernels.tuned}))


if __name__ == "__main__":
    main(sys.argv[1])
