"""One job of a real library's ``@triton.autotune`` kernels, timed per sequence length:

    python tools/bench_user_kernels.py --library fla --sizes 2048,4096,8192 \
        --out bench.jsonl --tag TAG [--reference DIR] [--steps 10]

``fla``: flash-linear-attention's delta rule (DeltaNet's ``chunk_delta_rule``, forward and
backward; its chunked kernels autotune on head sizes and chunk shapes, several of them
per sequence length). Not the gated delta rule: fla 0.6.0 refuses its backward with
Triton 3.4-3.7.0 on Hopper (a Triton miscompile), and the GPU machines have Triton 3.6.
``liger``: Liger-Kernel's DyT norm and fused SwiGLU MLP (forward and
backward; the MLP's TMA matmuls autotune configs that carry a ``pre_hook``, which
Triton's own file cache skips). Tokens vary with the size.

For each size: the first step's seconds (autotuning, compiling, the step itself), the
median of the later steps, and how many configs Triton benchmarked (``Autotuner._bench``
calls, counted here). With ``--reference DIR``, the first job to run saves the loss and
gradients of each size there and later jobs report their largest difference from it.
What decides the job's behaviour is its environment (tools/bench_user_kernels.sh sets
it): TUNECACHE_DB, TRITON_CACHE_AUTOTUNING, FLA_CACHE_RESULTS, TRITON_CACHE_DIR. Appends
one JSON line to --out when done.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--library", choices=("fla", "liger"), required=True)
    p.add_argument("--sizes", default="2048,4096,8192")
    p.add_argument("--steps", type=int, default=10, help="timed steps after the first")
    p.add_argument("--out", required=True, help="JSON lines file to append to")
    p.add_argument("--tag", default="")
    p.add_argument("--reference", default=None, metavar="DIR")
    p.add_argument("--profile-first", type=int, default=0, metavar="N",
                   help="cProfile the first step of the first size and print its N "
                        "costliest calls (cumulative)")
    return p.parse_args()


def _count_benchmarks() -> dict[str, int]:
    """Count every config Triton benchmarks, by kernel name (tool instrumentation)."""
    from triton.runtime.autotuner import Autotuner

    counts: dict[str, int] = {}
    bench = Autotuner._bench

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(self.base_fn, "__name__", "?")
        counts[name] = counts.get(name, 0) + 1
        return bench(self, *args, **kwargs)

    Autotuner._bench = counted
    return counts


def fla_step(torch: Any, tokens: int) -> tuple[Any, list[Any]]:
    from fla.ops.delta_rule import chunk_delta_rule

    torch.manual_seed(0)
    heads, dim = 16, 128
    kw = {"device": "cuda", "dtype": torch.bfloat16}
    q = torch.randn(1, tokens, heads, dim, **kw).requires_grad_()
    k = torch.randn(1, tokens, heads, dim, **kw).requires_grad_()
    v = torch.randn(1, tokens, heads, dim, **kw).requires_grad_()
    beta = torch.rand(1, tokens, heads, device="cuda", dtype=torch.bfloat16).requires_grad_()
    leaves = [q, k, v, beta]

    def step() -> Any:
        for t in leaves:
            t.grad = None
        o, _ = chunk_delta_rule(q, k, v, beta, use_qk_l2norm_in_kernel=True)
        loss = o.float().pow(2).mean()
        loss.backward()
        return loss

    return step, leaves


def liger_step(torch: Any, tokens: int) -> tuple[Any, list[Any]]:
    from liger_kernel.ops.dyt import LigerDyTFunction
    from liger_kernel.ops.mlp import LigerMLPFunction

    torch.manual_seed(0)
    dim, hidden = 2048, 5632
    kw = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(1, tokens, dim, **kw).requires_grad_()  # [batch, sequence, dim]
    alpha = torch.full((1,), 0.5, **kw).requires_grad_()
    gamma = torch.ones(dim, **kw).requires_grad_()
    beta = torch.zeros(dim, **kw).requires_grad_()
    wg = (torch.randn(hidden, dim, **kw) / dim ** 0.5).requires_grad_()
    wu = (torch.randn(hidden, dim, **kw) / dim ** 0.5).requires_grad_()
    wd = (torch.randn(dim, hidden, **kw) / hidden ** 0.5).requires_grad_()
    leaves = [x, alpha, gamma, beta, wg, wu, wd]

    def step() -> Any:
        for t in leaves:
            t.grad = None
        y = LigerDyTFunction.apply(x, alpha, gamma, beta)
        loss = LigerMLPFunction.apply(y, wg, wu, wd).float().pow(2).mean()
        loss.backward()
        return loss

    return step, leaves


def main() -> int:
    args = parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    counts = _count_benchmarks()
    build = fla_step if args.library == "fla" else liger_step
    sizes: dict[str, Any] = {}
    job_start = time.perf_counter()
    for tokens in [int(s) for s in args.sizes.split(",")]:
        before = sum(counts.values())
        step, leaves = build(torch, tokens)
        torch.cuda.synchronize()
        profiler = None
        if args.profile_first and not sizes:
            import cProfile

            profiler = cProfile.Profile()
        t0 = time.perf_counter()
        loss = profiler.runcall(step) if profiler is not None else step()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        if profiler is not None:
            import pstats

            print(f"{args.tag}: where the first step's {first:.2f} s went:")
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(
                args.profile_first)
        times = []
        for _ in range(args.steps):
            t1 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t1) * 1000)
        result = {"first_call_s": round(first, 3),
                  "step_ms": round(statistics.median(times), 3) if times else None,
                  "benchmarks": sum(counts.values()) - before}
        if args.reference:
            # The first step's values: every job computes them from the same seeded inputs.
            values = [loss.detach().float().cpu()] + [
                t.grad.detach().float().cpu() for t in leaves if t.grad is not None]
            path = Path(args.reference) / f"{args.library}-{tokens}.pt"
            if path.exists():
                ref = torch.load(path)
                result["max_abs_diff"] = max(float((a - b).abs().max())
                                             for a, b in zip(values, ref))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(values, path)
                result["reference_saved"] = True
        sizes[str(tokens)] = result
        print(f"{args.tag} {args.library} {tokens}: {result}", flush=True)

    import dataclasses

    import tunecache

    line = {
        "kind": "user_kernels_job", "tag": args.tag, "library": args.library,
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "seconds": round(time.perf_counter() - job_start, 3),
        "first_calls_s": round(sum(r["first_call_s"] for r in sizes.values()), 3),
        "benchmarks": sum(counts.values()), "benchmarks_by_kernel": counts, "sizes": sizes,
        "tunecache": tunecache.stats().user_kernels.as_dict(),
        # compiled kernels loaded from and published to the database (with a signing key)
        "kernel_store": dataclasses.asdict(tunecache.stats().kernels),
        "env": {k: v for k, v in os.environ.items()
                if k in ("TUNECACHE_DB", "TUNECACHE_SHARE", "TRITON_CACHE_AUTOTUNING",
                         "FLA_CACHE_RESULTS", "TRITON_CACHE_DIR", "TUNECACHE_MODE")},
    }
    with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    print(json.dumps({k: line[k] for k in ("tag", "first_calls_s", "benchmarks", "tunecache")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
