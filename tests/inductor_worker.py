"""One compiling process for tests/test_inductor.py and tools/demo.py.

Run as ``python tests/inductor_worker.py --ops bmm,linear --out result.json``; the caller
sets TUNECACHE_* and a fresh TORCHINDUCTOR_CACHE_DIR in the environment. It compiles tiny
GEMMs with real max-autotune on CPU (bmm: ATen vs the C++ bmm template; frozen
nn.Linear: mkl packed_linear vs the C++ GEMM template, which needs
``config.freezing=True``), and writes what tunecache did plus the outputs as JSON.

``--barrier DIR --parties N`` makes N concurrent workers begin compiling together, once
all are ready (imports done).
``--fake-torch-version V`` pretends to be another torch build (fingerprint change).
``--activation autoload`` activates through the torch.backends entry point function
instead of calling tunecache.inductor.enable().
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# The FX graph and AOTAutograd caches would skip lowering (and so every lookup) on a hit;
# each process also gets its own TORCHINDUCTOR_CACHE_DIR from the caller.
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="bmm,linear")
    parser.add_argument("--out", required=True)
    parser.add_argument("--barrier", default=None)  # a directory, with --parties
    parser.add_argument("--parties", type=int, default=0)
    parser.add_argument("--fake-torch-version", default=None)
    # The GEMMs' token count (bmm's M, linear's batch): another size is a new key of the
    # same family (transfer).
    parser.add_argument("--tokens", type=int, default=0)
    parser.add_argument("--activation", choices=["enable", "autoload", "none"], default="enable")
    args = parser.parse_args()

    if args.activation == "autoload":
        # What `import torch` does with our entry point installed (torch/__init__.py,
        # _import_device_backends): it runs before anything imports torch._inductor.
        from tunecache import _autoload

        _autoload.torch_backend_entry()

    import torch

    if args.fake_torch_version:
        torch.__version__ = args.fake_torch_version  # type: ignore[assignment]

    import torch._inductor.config as inductor_config

    import tunecache
    import tunecache.switch

    if args.activation == "enable":
        tunecache.enable()

    if args.barrier:
        import procs  # beside this script

        procs.file_barrier(Path(args.barrier), os.getpid(), args.parties)

    torch.manual_seed(0)
    outputs: dict[str, list] = {}
    compile_seconds: dict[str, float] = {}
    ops = [op for op in args.ops.split(",") if op]
    with torch.no_grad():
        if "bmm" in ops:
            a = torch.randn(4, args.tokens or 32, 48)
            b = torch.randn(4, 48, 40)
            fn = torch.compile(lambda x, y: torch.bmm(x, y).relu(),
                               mode="max-autotune-no-cudagraphs")
            t0 = time.perf_counter()
            outputs["bmm"] = fn(a, b).flatten()[:64].tolist()
            compile_seconds["bmm"] = time.perf_counter() - t0
        if "linear" in ops:
            inductor_config.freezing = True
            model = torch.nn.Linear(64, 32).eval()
            x = torch.randn(args.tokens or 16, 64)
            compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
            t0 = time.perf_counter()
            outputs["linear"] = compiled(x).flatten()[:64].tolist()
            compile_seconds["linear"] = time.perf_counter() - t0

    result = {
        "pid": os.getpid(),
        "enabled": tunecache.is_enabled(),
        "parts": tunecache.switch.parts_on(),
        "stats": tunecache.stats().gemm.as_dict(),
        "outputs": outputs,
        "compile_seconds": compile_seconds,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
