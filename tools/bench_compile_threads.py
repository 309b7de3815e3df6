"""How much faster Triton compiles a kernel's configs in threads than one after another.

    python tools/bench_compile_threads.py [--threads 2 4] [--arch 90] [--json]

Coordinate descent compiles each candidate config of a kernel in the thread that
benchmarks it, one after another; that is most of a full descent's seconds
(docs/benchmarks/new-shapes.md). Compiling a round's candidates ahead in threads pays only where
Triton's compile leaves the GIL for a good part of its time (LLVM, ptxas), which this
measures: an Inductor-style looped reduction, compiled for a CUDA target (no GPU needed:
nothing is launched) in each of several configs, first serially, then over a thread
pool, each pass in a Triton cache directory of its own so that nothing is a cache hit.
It reports the seconds of each pass, the speed-up, and the fraction of a compile that ran
in parallel by Amdahl's law on min(threads, cores).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# What coordinate descent varies on a reduction: its block sizes and warps.
XBLOCKS = (1, 2, 4, 8)
RBLOCKS = (64, 128, 256)
WARPS = (2, 4)


def _reduction_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def rms_rows(x_ptr, y_ptr, xnumel, rnumel,
                 XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
        xidx = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
        acc = tl.zeros([XBLOCK, RBLOCK], tl.float32)
        for r0 in range(0, rnumel, RBLOCK):
            ridx = r0 + tl.arange(0, RBLOCK)[None, :]
            mask = (xidx < xnumel) & (ridx < rnumel)
            v = tl.load(x_ptr + xidx * rnumel + ridx, mask, other=0.0)
            acc += v * v
        total = tl.sum(acc, 1)[:, None]
        tl.store(y_ptr + xidx, tl.rsqrt(total / rnumel + 1e-6), xidx < xnumel)

    return rms_rows


def _compiler(arch: int) -> Callable[[tuple[int, int, int]], Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = _reduction_kernel()
    target = GPUTarget("cuda", arch, 32)
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "xnumel": "i32", "rnumel": "i32",
                 "XBLOCK": "constexpr", "RBLOCK": "constexpr"}

    def compile_config(config: tuple[int, int, int]) -> Any:
        xblock, rblock, warps = config
        source = ASTSource(kernel, signature, {"XBLOCK": xblock, "RBLOCK": rblock})
        return triton.compile(source, target=target, options={"num_warps": warps})

    return compile_config


def _timed_pass(compile_config: Callable[[tuple[int, int, int]], Any],
                configs: list[tuple[int, int, int]], threads: int) -> tuple[float, int]:
    """The pass's seconds, and how many kernels it compiled (the entries Triton wrote to
    the pass's own cache directory, one per compile: none was a cache hit)."""
    with tempfile.TemporaryDirectory(prefix="tunecache-compile-") as cache_dir:
        os.environ["TRITON_CACHE_DIR"] = cache_dir
        start = time.perf_counter()
        if threads <= 1:
            for config in configs:
                compile_config(config)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(compile_config, configs))
        seconds = time.perf_counter() - start
        return seconds, len(os.listdir(cache_dir))


def parallel_fraction(speedup: float, workers: int) -> float | None:
    """Amdahl's law solved for the parallel fraction p: speedup = 1 / ((1 - p) + p / n)."""
    if workers <= 1 or speedup <= 0:
        return None
    return (1 - 1 / speedup) / (1 - 1 / workers)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[2, 4])
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90: H100/H200)")
    p.add_argument("--configs", type=int, default=len(XBLOCKS) * len(RBLOCKS) * len(WARPS),
                   help="how many configs each pass compiles")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        compile_config = _compiler(args.arch)
    except ImportError as e:
        raise SystemExit(f"bench_compile_threads: Triton is not importable here: {e}") from None
    configs = list(itertools.product(XBLOCKS, RBLOCKS, WARPS))[:max(1, args.configs)]
    compile_config(configs[0])  # imports and the backend's first-use set-up, untimed
    cores = os.cpu_count() or 1
    serial, compiled = _timed_pass(compile_config, configs, 1)
    report: dict[str, Any] = {"configs": len(configs), "cores": cores,
                              "serial_seconds": round(serial, 3), "serial_compiled": compiled,
                              "ms_per_compile": round(serial / len(configs) * 1000, 1),
                              "threaded": []}
    for threads in args.threads:
        seconds, compiled = _timed_pass(compile_config, configs, threads)
        speedup = serial / seconds
        fraction = parallel_fraction(speedup, min(threads, cores, len(configs)))
        report["threaded"].append({
            "threads": threads, "seconds": round(seconds, 3), "compiled": compiled,
            "speedup": round(speedup, 2),
            "parallel_fraction": None if fraction is None else round(fraction, 2)})
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['configs']} configs, {cores} cores: serial {serial:.2f} s "
          f"({report['ms_per_compile']} ms a compile)")
    for row in report["threaded"]:
        print(f"  {row['threads']} threads: {row['seconds']:.2f} s, {row['speedup']}x, "
              f"parallel fraction {row['parallel_fraction']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
