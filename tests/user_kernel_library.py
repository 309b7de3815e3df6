"""A user's library with one ``@triton.autotune`` kernel at module level, as Liger-Kernel
and flash-linear-attention define theirs: importable, so that `tunecache warm
--user-kernels user_kernel_library` can find the kernel by its name. Run under Triton's
interpreter (no GPU); a ``do_bench`` of the kernel's own times each config and counts the
benchmarks.

``job(OUT.json, "1000,3000")`` runs the kernel at each size as a job would and writes how
many configs it benchmarked, whether each output was right, and tunecache's user-kernel
counters. (A job imports the library: run as ``__main__``, its kernel would be named
``__main__.accumulate``.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch  # first, as in a job: importing it runs tunecache's autoload hook
import triton
import triton.language as tl

benchmarks = 0


def cpu_bench(kernel_call, quantiles):  # type: ignore[no-untyped-def]
    global benchmarks
    benchmarks += 1
    t0 = time.perf_counter()
    kernel_call()
    ms = (time.perf_counter() - t0) * 1000
    return [ms, ms, ms]


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w)
                          for b, w in ((64, 1), (128, 2), (256, 4))],
                 key=["n"], do_bench=cpu_bench, restore_value=["out"])
@triton.jit
def accumulate(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(out + offs, mask=mask) + tl.load(x + offs, mask=mask),
             mask=mask)


def add_into(out: torch.Tensor, x: torch.Tensor) -> None:
    n = x.numel()
    accumulate[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)


def job(out_path: str, sizes: str) -> None:
    correct = {}
    for n in [int(s) for s in sizes.split(",")]:
        x = torch.arange(n, dtype=torch.float32)
        out = torch.ones(n)
        add_into(out, x)
        correct[str(n)] = bool(torch.equal(out, x + 1))
    import tunecache

    Path(out_path).write_text(json.dumps({"benchmarks": benchmarks, "correct": correct,
                                          "stats": tunecache.stats().user_kernels.as_dict()}))
