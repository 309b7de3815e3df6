"""Does a kernel's Triton cache key depend on which process compiles it? (GPU.)

    python tools/triton_key_check.py

Compiles one small kernel and prints its cache key (``CompiledKernel.hash``) three ways:
in this process as it starts; in a child started as Inductor starts its compile workers
(``torch._inductor.compile_worker`` points Triton at torch's own ptxas, where the wheel
ships one); and in this process after tunecache enabled kernel sharing. Also prints the
ptxas each one uses and its version line. One JSON line; "same_key_everywhere" is the
answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def compile_key() -> dict[str, str]:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def scale(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    x = torch.ones(256, device="cuda")
    compiled = scale[(2,)](x, 256, BLOCK=128)
    from triton.backends.nvidia import compiler

    version = compiler.get_ptxas_version(90).strip().splitlines()[-1]
    return {"key": compiled.hash[:16], "ptxas": compiler.get_ptxas(90).path,
            "ptxas_version": version, "TRITON_PTXAS_PATH": os.environ.get(
                "TRITON_PTXAS_PATH", "")}


def main() -> int:
    if sys.argv[1:] == ["--as-worker"]:
        import torch._inductor.compile_worker.__main__  # noqa: F401 - its start sets ptxas

        print(json.dumps(compile_key()))
        return 0
    out: dict[str, object] = {"main_at_start": compile_key()}
    child = subprocess.run([sys.executable, __file__, "--as-worker"], capture_output=True,
                           text=True, timeout=300)
    out["worker"] = (json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0
                     else child.stderr[-2000:])
    import tunecache.inductor

    out["tunecache_enabled"] = tunecache.inductor.enable()
    out["main_after_enable"] = compile_key()
    keys = {v["key"] for v in out.values() if isinstance(v, dict)}
    out["same_key_everywhere"] = len(keys) == 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
