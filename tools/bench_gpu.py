"""Compile-time benchmark of GEMM autotuning on a multi-GPU node, with and without tunecache.

    torchrun --nproc-per-node 2 tools/bench_gpu.py --mode plain --out bench.jsonl
    torchrun --nproc-per-node 2 tools/bench_gpu.py --mode inductor-distributed --out bench.jsonl
    TUNECACHE_DB=/shared/tc.db torchrun --nproc-per-node 2 tools/bench_gpu.py --mode tunecache \
        --out bench.jsonl
    torchrun --nproc-per-node 2 tools/bench_gpu.py --mode default --out bench.jsonl
    python tools/bench_gpu.py --tiny --device cpu --mode tunecache --out /tmp/b.jsonl   # smoke test

The model (``--model block``) is a 2-layer llama-like block (hidden 4096, MLP 14336, 32
query heads and 8 KV heads of 128, i.e. KV dim 1024; 8192 tokens; bf16), forward +
backward: about ten distinct GEMM keys. ``--model mlp`` is a structure without norms or
attention: ``--layers`` residual MLPs ``x + down(gelu(up(x)))``. ``--model gpt`` is a
GPT-2-style layer of another structure: LayerNorm with bias, one fused QKV projection with
bias (addmm), multi-head causal SDPA without grouped KV, and a GELU MLP with biases.
``--model reduce`` is a block whose large GEMMs feed reductions: an RMSNorm, then a
projection whose output is centred by its row mean and shifted by its mean over the whole
tensor (a reduction to one scalar, broadcast-added into the residual), beside a gated MLP
on the same normed input. Modes:

``default``               torch.compile without max-autotune
``plain``                 max-autotune (every rank benchmarks every GEMM)
``inductor-distributed``  max-autotune + ``config.distributed_max_autotune_gemm=True``
``tunecache``             max-autotune + tunecache (cold or warm: whatever TUNECACHE_DB holds)

Every rank uses a fresh TORCHINDUCTOR_CACHE_DIR unless ``--keep-inductor-cache DIR`` is
given (then DIR/rank<N>), and the FX graph and AOTAutograd caches are off, so every run
lowers and autotunes for real; ``--inductor-caches`` leaves them on (a job restarted on
the same node). Every line reports Inductor's own cache counters
(``torch._dynamo.utils.counters``: fxgraph_cache_*, autograd_cache_*). Compile seconds =
the first forward+backward (synchronised).
GEMM benchmarks are counted by tunecache.inductor's wrapper around Inductor's benchmark
callable; in the plain and inductor-distributed modes the same wrapper runs in count-only
mode (no cache), so the numbers are comparable. Each rank appends one JSON line to
``--out``; rank 0 appends one more with the job's totals.

Needs only torch (+ triton on GPU) and tunecache (+ sqlalchemy, alembic, psycopg).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODES = ("default", "plain", "inductor-distributed", "tunecache")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--out", required=True, help="JSON lines file to append to")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny sizes (CPU smoke test)")
    p.add_argument("--model", choices=("block", "mlp", "gpt", "reduce"), default="block")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--mlp", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    # The median of 5 steps moved by 3-4 % between jobs running the same kernels, too
    # coarse for a 1 % step target; 40 steps read within 1 % (docs/benchmarks/upgrade.md).
    p.add_argument("--steps", type=int, default=40, help="timed steps after the compile")
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                   help="torch.compile mode for the max-autotune modes")
    p.add_argument("--keep-inductor-cache", metavar="DIR", default=None,
                   help="use DIR/rank<N> as TORCHINDUCTOR_CACHE_DIR instead of a fresh one")
    p.add_argument("--inductor-caches", action="store_true",
                   help="leave Inductor's FX graph and AOTAutograd caches on")
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None,
                   help="process group backend (default: nccl when every rank has a GPU)")
    p.add_argument("--tag", default="", help="free text copied into every JSON line")
    p.add_argument("--wait-compile-pool", action="store_true",
                   help="start Inductor's compile workers and wait until they answer before "
                        "the compile step (counted in its seconds): kernels then never "
                        "compile in the main process while the pool starts")
    p.add_argument("--profile-compile", type=int, default=0, metavar="N",
                   help="cProfile the compile step and print its N costliest calls "
                        "(cumulative, then by their own time)")
    args = p.parse_args()
    if args.tiny:
        args.tokens, args.hidden, args.mlp, args.heads, args.kv_heads = 64, 64, 128, 4, 2
        args.steps = min(args.steps, 2)
    return args


def setup_env(args: argparse.Namespace, rank: int) -> str:
    """Environment that must be set before torch reads it."""
    if args.keep_inductor_cache:
        cache_dir = os.path.join(args.keep_inductor_cache, f"rank{rank}")
        os.makedirs(cache_dir, exist_ok=True)
    else:
        cache_dir = tempfile.mkdtemp(prefix=f"inductor-{args.mode}-rank{rank}-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    # An FX graph or AOTAutograd cache hit skips lowering, and with it every GEMM lookup.
    caches = "1" if args.inductor_caches else "0"
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = caches
    os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = caches
    if args.mode != "tunecache":
        # The autoload hook must not turn tunecache on in the comparison modes.
        os.environ["TUNECACHE_MODE"] = "off"
    return cache_dir


def build_model(args: argparse.Namespace, torch: Any) -> Any:
    nn = torch.nn
    Module: Any = nn.Module  # torch is untyped here: a base class of type Any
    F = torch.nn.functional
    if args.model == "mlp":
        class Residual(Module):
            def __init__(self) -> None:
                super().__init__()
                self.up = nn.Linear(args.hidden, args.mlp)
                self.down = nn.Linear(args.mlp, args.hidden)

            def forward(self, x: Any) -> Any:
                return x + self.down(F.gelu(self.up(x)))

        return nn.Sequential(*[Residual() for _ in range(args.layers)])

    class RMSNorm(Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x: Any) -> Any:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    if args.model == "reduce":
        class ReduceLayer(Module):
            def __init__(self) -> None:
                super().__init__()
                self.norm = RMSNorm(args.hidden)
                self.proj = nn.Linear(args.hidden, args.hidden, bias=False)
                self.gate = nn.Linear(args.hidden, args.mlp, bias=False)
                self.up = nn.Linear(args.hidden, args.mlp, bias=False)
                self.down = nn.Linear(args.mlp, args.hidden, bias=False)

            def forward(self, x: Any) -> Any:
                h = self.norm(x)
                p = self.proj(h)
                wide = p.float()
                centred = p - wide.mean(-1, keepdim=True).to(p.dtype)
                x = x + centred + wide.mean().to(p.dtype)
                return x + self.down(F.silu(self.gate(h)) * self.up(h))

        return nn.Sequential(*[ReduceLayer() for _ in range(args.layers)])

    head_dim = args.hidden // args.heads
    kv_dim = args.kv_heads * head_dim
    if args.model == "gpt":
        class GPTLayer(Module):
            def __init__(self) -> None:
                super().__init__()
                self.ln1 = nn.LayerNorm(args.hidden)
                self.qkv = nn.Linear(args.hidden, 3 * args.hidden)
                self.proj = nn.Linear(args.hidden, args.hidden)
                self.ln2 = nn.LayerNorm(args.hidden)
                self.fc = nn.Linear(args.hidden, args.mlp)
                self.out = nn.Linear(args.mlp, args.hidden)

            def forward(self, x: Any) -> Any:
                t = x.shape[0]
                q, k, v = self.qkv(self.ln1(x)).view(t, 3, args.heads, head_dim).unbind(1)
                a = F.scaled_dot_product_attention(q.transpose(0, 1)[None],
                                                   k.transpose(0, 1)[None],
                                                   v.transpose(0, 1)[None], is_causal=True)[0]
                x = x + self.proj(a.transpose(0, 1).reshape(t, args.hidden))
                return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

        return nn.Sequential(*[GPTLayer() for _ in range(args.layers)])

    class Layer(Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn_norm = RMSNorm(args.hidden)
            self.q = nn.Linear(args.hidden, args.hidden, bias=False)
            self.k = nn.Linear(args.hidden, kv_dim, bias=False)
            self.v = nn.Linear(args.hidden, kv_dim, bias=False)
            self.o = nn.Linear(args.hidden, args.hidden, bias=False)
            self.mlp_norm = RMSNorm(args.hidden)
            self.gate = nn.Linear(args.hidden, args.mlp, bias=False)
            self.up = nn.Linear(args.hidden, args.mlp, bias=False)
            self.down = nn.Linear(args.mlp, args.hidden, bias=False)

        def forward(self, x: Any) -> Any:
            t = x.shape[0]
            h = self.attn_norm(x)
            q = self.q(h).view(t, args.heads, head_dim).transpose(0, 1)
            k = self.k(h).view(t, args.kv_heads, head_dim).transpose(0, 1)
            v = self.v(h).view(t, args.kv_heads, head_dim).transpose(0, 1)
            rep = args.heads // args.kv_heads
            k = k.repeat_interleave(rep, dim=0)
            v = v.repeat_interleave(rep, dim=0)
            a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
            x = x + self.o(a.transpose(0, 1).reshape(t, args.hidden))
            h = self.mlp_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    return nn.Sequential(*[Layer() for _ in range(args.layers)])


def compile_time_breakdown(torch: Any) -> dict[str, float] | str:
    """Seconds per dynamo_timed phase (torch._dynamo.utils), summed over calls."""
    utils = torch._dynamo.utils
    metrics = getattr(utils, "compilation_time_metrics", None)
    if isinstance(metrics, dict):
        return {k: round(sum(v), 3) for k, v in sorted(metrics.items(), key=lambda kv: -sum(kv[1]))}
    return str(utils.compile_times(repr="str", aggregate=True))


def inductor_cache_counters(torch: Any) -> dict[str, int]:
    """Inductor's own FX graph and AOTAutograd cache counters (hit, miss, bypass ...)."""
    counters = torch._dynamo.utils.counters
    found = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
    found.update((k, v) for k, v in counters["aot_autograd"].items()
                 if k.startswith("autograd_cache"))
    return dict(sorted(found.items()))


def shape_profile(torch: Any) -> dict[str, Any]:
    """Dynamo's shape profile in this process (torch._dynamo.pgo): the frames it has a
    state for, the inputs it compiles dynamic (a dimension seen to change, here or by an
    earlier job of the job id), and the graphs Dynamo compiled."""
    found: dict[str, Any] = {
        "unique_graphs": torch._dynamo.utils.counters["stats"].get("unique_graphs", 0)}
    try:
        from torch._dynamo import pgo

        dynamic = pgo.auto_dynamic
        states = pgo._CODE_STATE or {}
        found["frames"] = len(states)
        # A tensor's entry has its sizes as a tuple (each an int or "dynamic") and its
        # scalar "dynamic" (it is no scalar); a scalar's has its size "dynamic" and its
        # value as the scalar.
        found["dynamic_inputs"] = sorted({
            name for state in states.values() for name, entry in state.automatic_dynamic.items()
            if (any(s is dynamic for s in entry.size) if isinstance(entry.size, tuple)
                else entry.scalar is dynamic)})[:20]
    except Exception as e:  # noqa: BLE001 - another torch's internals: report, go on
        found["error"] = repr(e)
    return found


def graph_counts() -> dict[str, int]:
    import tunecache

    return dataclasses.asdict(tunecache.stats().graphs)


def kernel_store(args: argparse.Namespace) -> dict[str, int] | None:
    """Compiled Triton kernels in TUNECACHE_DB (tunecache.triton_cache): how many, and their
    loads by jobs; None without tunecache. Rank 0 reads it before the compile and after
    the steps: the difference is what this job published, and loaded from the store."""
    if args.mode != "tunecache" or not os.environ.get("TUNECACHE_DB"):
        return None
    import tunecache
    from tunecache import ops

    cache = tunecache.open()  # the job creates the database if it is new; so may this
    try:
        db = cache.database()
        if db is None:
            return None
        kernels = [k for k in ops.graph_stats(db).by_kind if k["kind"] == "kernel"]
    except Exception as e:  # noqa: BLE001 - a database not created yet
        print(f"kernel counts not read: {e!r}", file=sys.stderr)
        return {"count": 0, "hits": 0}
    finally:
        cache.close()
    return {"count": sum(k["count"] for k in kernels), "hits": sum(k["hits"] for k in kernels)}


def gather_json(obj: Any, world: int, device: Any, torch: Any) -> list[Any]:
    """all_gather of a JSON-able object without numpy (dist.all_gather_object needs it:
    torch/distributed/distributed_c10d.py _tensor_to_object calls Tensor.numpy())."""
    import torch.distributed as dist

    data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8).to(device)
    size = torch.tensor([data.numel()], device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    chunks = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(chunks, padded)
    return [json.loads(bytes(c[: int(s.item())].tolist())) for c, s in zip(chunks, sizes)]


def main() -> int:
    args = parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cache_dir = setup_env(args, rank)
    sys.path.insert(0, str(REPO))

    import torch
    import torch._inductor.config as inductor_config
    import torch.distributed as dist

    import tunecache

    if args.mode == "inductor-distributed" and importlib.util.find_spec("numpy") is None:
        sys.exit("--mode inductor-distributed needs numpy: Inductor shares its results with "
                 "dist.all_gather_object, which needs it (pip install numpy)")
    gpu = local_rank % torch.cuda.device_count() if args.device == "cuda" else 0
    if world > 1:
        # More ranks than GPUs (coordination runs): NCCL refuses two ranks on one GPU, and
        # this script's own collectives are tiny, so gloo does.
        backend = args.backend or ("nccl" if args.device == "cuda" and
                                   world <= torch.cuda.device_count() else "gloo")
        if args.device == "cuda":
            torch.cuda.set_device(gpu)
        dist.init_process_group(backend)
    device = torch.device(args.device, gpu) if args.device == "cuda" else torch.device("cpu")
    comm_device = device if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"

    enabled = False
    if args.mode == "tunecache":
        enabled = tunecache.enable()
        if not enabled:
            print(f"rank {rank}: tunecache did not enable (see the warning above)", file=sys.stderr)
    elif args.mode in ("plain", "inductor-distributed"):
        enabled = tunecache.enable(count_only=True)
    if args.mode == "inductor-distributed":
        inductor_config.distributed_max_autotune_gemm = True

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = build_model(args, torch).to(device=device, dtype=dtype)
    x = torch.randn(args.tokens, args.hidden, device=device, dtype=dtype, requires_grad=True)
    mode = None if args.mode == "default" else args.compile_mode
    compiled = torch.compile(model, mode=mode)

    def step() -> None:
        # Under mode="max-autotune" (CUDA graph trees) a new step must be marked, and
        # gradients not accumulated into the last step's: they are outputs of a graph
        # the next replay overwrites (a training loop's zero_grad). No-ops otherwise.
        torch.compiler.cudagraph_mark_step_begin()
        model.zero_grad(set_to_none=True)
        x.grad = None
        compiled(x).float().pow(2).mean().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    kernels_before = kernel_store(args) if rank == 0 else None
    if world > 1:
        dist.barrier()
    profiler = None
    if args.profile_compile:
        import cProfile

        profiler = cProfile.Profile()
    t0 = time.perf_counter()
    pool_wait_seconds = None
    if args.wait_compile_pool:
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.warm_pool()
        AsyncCompile.wait_pool_ready()
        pool_wait_seconds = time.perf_counter() - t0
    if profiler is not None:
        profiler.runcall(step)
    else:
        step()
    compile_seconds = time.perf_counter() - t0
    if profiler is not None:
        import pstats

        print(f"rank {rank}: where the compile step's {compile_seconds:.1f} s went:")
        profile_stats = pstats.Stats(profiler, stream=sys.stdout)
        profile_stats.sort_stats("cumulative").print_stats(args.profile_compile)
        # Python 3.12's cProfile hears every thread (sys.monitoring), so the cumulative
        # view can lack the outer frames (Inductor's phases); the calls' own time still
        # says where the process was.
        profile_stats.sort_stats("tottime").print_stats(args.profile_compile)

    # The second step on its own: where a rank that launched kernels untuned while a
    # peer tuned them (tunecache's split of Triton coordinate descent) waits for and
    # compiles the peer's configs. It is part of what a cold job pays.
    second_step_seconds = step_ms = None
    step_times: list[float] = []
    if args.steps > 0:
        t1 = time.perf_counter()
        step()
        second_step_seconds = time.perf_counter() - t1
    for _ in range(args.steps - 1):
        t1 = time.perf_counter()
        step()
        step_times.append((time.perf_counter() - t1) * 1000)
    if step_times:
        step_ms = statistics.median(step_times)

    kernels_after = kernel_store(args) if rank == 0 else None
    counted = tunecache.stats()
    stats = counted.gemm.as_dict()
    sources: dict[str, int] = {}
    for event in stats["events"]:
        sources[event["source"]] = sources.get(event["source"], 0) + 1
    line: dict[str, Any] = {
        "kind": "rank",
        "tag": args.tag,
        "mode": args.mode,
        "rank": rank,
        "world": world,
        "host": socket.gethostname(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "tiny": args.tiny,
        "model": args.model,
        "layers": args.layers,
        "inductor_caches": args.inductor_caches,
        "compile_mode": mode,
        "tunecache_enabled": enabled,
        "tunecache_db": os.environ.get("TUNECACHE_DB") if args.mode == "tunecache" else None,
        "inductor_cache_dir": cache_dir,
        "compile_seconds": round(compile_seconds, 3),
        "compile_pool_wait_seconds": (None if pool_wait_seconds is None
                                      else round(pool_wait_seconds, 3)),
        "second_step_seconds": (None if second_step_seconds is None
                                else round(second_step_seconds, 3)),
        # median of the steps after the second (each synchronised)
        "step_ms": None if step_ms is None else round(step_ms, 3),
        "steps_timed": len(step_times),
        "tokens": args.tokens,
        "gemm_benchmarks": stats["benchmarks"],
        "gemm_candidates_benchmarked": stats["candidates_benchmarked"],
        "gemm_benchmark_seconds": round(stats["benchmark_seconds"], 3),
        "gemm_lookups_by_source": sources,
        # Stored GEMMs whose template choices were cut before generation (narrow.py), the
        # choices not generated, lists of 2+ templates generated in full, mismatches.
        "gemm_choice_lists_narrowed": stats.get("choice_lists_narrowed", 0),
        "gemm_choices_not_generated": stats.get("choices_not_generated", 0),
        "gemm_choice_lists_in_full": stats.get("choice_lists_in_full", 0),
        "gemm_narrowing_mismatches": stats.get("narrowing_mismatches", 0),
        # New keys tuned from their neighbours (transfer.py): keys, candidates left out,
        # choice lists cut before generation, and cut to the one choice neighbours decided.
        "gemm_transferred_keys": stats.get("transferred_keys", 0),
        "gemm_transfer_skipped": stats.get("transfer_skipped", 0),
        "gemm_choice_lists_transferred": stats.get("choice_lists_transferred", 0),
        "gemm_choice_lists_decided": stats.get("choice_lists_decided", 0),
        "gemm_keys": sorted({e["key_hash"] for e in stats["events"] if e.get("key_hash")}),
        # Benchmark calls by the key they measured (a top-up of new candidates is a key
        # of its own): how many distinct keys were measured, and was any measured twice?
        "gemm_benchmarks_by_key": stats["benchmarks_by_key"],
        "gemm_lookups": [
            {k: e.get(k) for k in ("op", "source", "candidates", "missing", "missing_ids")}
            | {"key": (e.get("key_hash") or "")[:12]}
            for e in stats["events"] if e["source"] != "memo" or e.get("missing")
        ],
        "triton_autotune": counted.triton.as_dict(),  # Triton best-config cache
        "inductor_cache_counters": inductor_cache_counters(torch),
        # Compiled graphs through the database (tunecache.core.graphs): loaded, published,
        # present (another rank or job published it first), absent, refused.
        "graphs": graph_counts(),
        "shape_profile": shape_profile(torch),
        # Compiled Triton kernels in the database, rank 0's reading before and after
        # (tunecache.triton_cache: every process of the job, compile workers included, publishes
        # what it compiled and loads what a peer or an earlier job compiled).
        "kernels_published": (None if kernels_after is None or kernels_before is None
                              else kernels_after["count"] - kernels_before["count"]),
        "kernels_loaded": (None if kernels_after is None or kernels_before is None
                           else kernels_after["hits"] - kernels_before["hits"]),
        # This rank's own kernel lookups (tunecache.stats().kernels): loaded from the
        # database, absent there (so compiled), published, refused; compile workers count
        # their own.
        "kernel_counts": dataclasses.asdict(counted.kernels),
        # Kernels in this rank's local Triton cache after the job (each compiled here, or
        # loaded from the store or from a compiled graph's bundle).
        "triton_kernels_local": sum(1 for _ in Path(
            os.environ.get("TRITON_CACHE_DIR") or Path(cache_dir) / "triton"
        ).rglob("__grp__*.json")),
        "compile_times": compile_time_breakdown(torch),
    }

    everyone = gather_json(line, world, comm_device, torch) if world > 1 else [line]
    # O_APPEND writes of one line each: ranks on one host do not interleave within a line.
    with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
        if rank == 0:
            job = {
                "kind": "job",
                "tag": args.tag,
                "mode": args.mode,
                "world": world,
                "compile_seconds_max": max(r["compile_seconds"] for r in everyone),
                "compile_seconds_by_rank": [r["compile_seconds"] for r in everyone],
                "gemm_benchmarks": sum(r["gemm_benchmarks"] for r in everyone),
                "gemm_benchmarks_by_rank": [r["gemm_benchmarks"] for r in everyone],
                "distinct_gemm_keys": len({k for r in everyone for k in r["gemm_keys"]}),
                **_keys_benchmarked(everyone),
                "step_ms_by_rank": [r["step_ms"] for r in everyone],
                "second_step_seconds_max": max(r["second_step_seconds"] or 0 for r in everyone),
                "triton_saves": sum(r["triton_autotune"]["puts"] for r in everyone),
                "triton_deferred": sum(r["triton_autotune"].get("deferred", 0) for r in everyone),
                "triton_adopted": sum(r["triton_autotune"].get("adopted", 0) for r in everyone),
                # coordinate descents settled by transfer (neighbours' configs benchmarked,
                # no descent), decided by neighbours that agree (nothing benchmarked), and
                # full descents run (triton/coordesc.py)
                "triton_coordesc_transferred": sum(
                    r["triton_autotune"].get("coordesc_transferred", 0) for r in everyone),
                "triton_coordesc_decided": sum(
                    r["triton_autotune"].get("coordesc_decided", 0) for r in everyone),
                "triton_coordesc_full": sum(
                    r["triton_autotune"].get("coordesc_full", 0) for r in everyone),
                "triton_transfer_benchmarks": sum(
                    r["triton_autotune"].get("transfer_benchmarks", 0) for r in everyone),
                # candidate configs compiled in threads ahead of their benchmark, and
                # those a benchmark took (the compile_ahead lever)
                "triton_compiled_ahead": sum(
                    r["triton_autotune"].get("compiled_ahead", 0) for r in everyone),
                "triton_served_ahead": sum(
                    r["triton_autotune"].get("served_ahead", 0) for r in everyone),
                "fusion_benchmarks_run": sum(r["triton_autotune"].get("fusion_measured", 0)
                                             for r in everyone),
                # fusion candidates compiled only to be benchmarked, and those skipped
                # because their timing was stored (triton/candidates.py)
                "fusion_candidates_compiled": sum(
                    r["triton_autotune"].get("fusion_candidates_compiled", 0) for r in everyone),
                "fusion_compiles_skipped": sum(
                    r["triton_autotune"].get("fusion_compiles_skipped", 0) for r in everyone),
                # epilogue-fusion decisions replayed without benchmarks (decided by
                # neighbours among them), and own decisions replaced by a peer's
                **{f"fusion_decisions_{what}": sum(
                    r["triton_autotune"].get(f"fusion_decisions_{what}", 0) for r in everyone)
                   for what in ("replayed", "decided", "adopted")},
                "gemm_choices_not_generated": sum(r["gemm_choices_not_generated"]
                                                  for r in everyone),
                "gemm_narrowing_mismatches": sum(r["gemm_narrowing_mismatches"]
                                                 for r in everyone),
                "gemm_candidates_benchmarked": sum(r["gemm_candidates_benchmarked"]
                                                   for r in everyone),
                "gemm_transferred_keys": sum(r["gemm_transferred_keys"] for r in everyone),
                "gemm_transfer_skipped": sum(r["gemm_transfer_skipped"] for r in everyone),
                "tokens": args.tokens,
                "coordesc_seconds_max": max(_coordesc_seconds(r) for r in everyone),
                "model": args.model,
                "layers": args.layers,
                "inductor_cache_counters": _summed(r["inductor_cache_counters"] for r in everyone),
                "graphs": _summed(r["graphs"] for r in everyone),
                "shape_profile": everyone[0]["shape_profile"],
                # the settings a job of tools/bench_kernels.sh or bench_pgo.sh varies
                "tunecache_env": {k: v for k, v in os.environ.items()
                                  if k in ("TUNECACHE_MODE", "TUNECACHE_SHARE",
                                           "TUNECACHE_LEVERS", "TORCH_COMPILE_JOB_ID")},
                "kernels_published": everyone[0]["kernels_published"],
                "kernels_loaded": everyone[0]["kernels_loaded"],
                "triton_kernels_local": sum(r["triton_kernels_local"] for r in everyone),
                "kernel_counts": _summed(r["kernel_counts"] for r in everyone),
            }
            f.write(json.dumps(job) + "\n")
            print(json.dumps(job))
    print(f"rank {rank}: {args.mode}: compile {compile_seconds:.1f}s, "
          f"{stats['benchmarks']} GEMM benchmark(s), step {step_ms} ms")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _coordesc_seconds(rank_line: dict[str, Any]) -> float:
    """Seconds in Triton coordinate descent (Inductor's dynamo_timed phase), and in
    tunecache's transfer where that replaced it."""
    times = rank_line.get("compile_times")
    descent = sum(v for k, v in times.items() if "coordinate_descent" in k) \
        if isinstance(times, dict) else 0.0
    return round(descent + rank_line["triton_autotune"].get("transfer_seconds", 0.0), 3)


def _summed(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total


def _keys_benchmarked(everyone: list[dict[str, Any]]) -> dict[str, int]:
    """Keys measured in the job (base keys and top-ups), and those measured more than once
    (by two ranks, or twice in one): tunecache's promise is that this is zero."""
    calls: dict[str, int] = {}
    for r in everyone:
        for key, n in r["gemm_benchmarks_by_key"].items():
            calls[key] = calls.get(key, 0) + n
    return {"gemm_keys_benchmarked": len(calls),
            "gemm_keys_benchmarked_twice": sum(1 for n in calls.values() if n > 1)}


if __name__ == "__main__":
    sys.exit(main())
