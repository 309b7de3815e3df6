"""tunecache's "main job" demo: CPU only, the embedded default database, real max-autotune.

    python tools/demo.py            # the real default database ($XDG_CACHE_HOME/tunecache)
    python tools/demo.py --fresh    # a throw-away XDG_CACHE_HOME, so job 1 starts cold

Job 1 starts ``--procs`` processes at once (think: ranks of one job) that each compile a
bmm and a frozen nn.Linear with ``torch.compile(mode="max-autotune-no-cudagraphs")``.
On CPU both really autotune (ATen vs the C++ template; mkl vs the C++ GEMM template).
Job 2 is "a later job": the same processes again, each with a fresh
TORCHINDUCTOR_CACHE_DIR (as on a new node), so only tunecache can help it. The demo
prints what each process tuned and reused, benchmarks per job, and compile seconds.

Every process has its own TORCHINDUCTOR_CACHE_DIR and the FX graph and AOTAutograd
caches off, so each GEMM really reaches the autotuner; TUNECACHE_DB is removed from the
children's environment so that they use the default database (unless --db is given).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
KEYS_PER_PROCESS = 2  # bmm + packed_linear


def worker(out: str, start_at: float) -> int:
    """One process of a job: compile, then write what tunecache did as JSON."""
    import torch
    import torch._inductor.config as inductor_config

    from tunecache import inductor as tc_inductor

    tc_inductor.enable()
    time.sleep(max(0.0, start_at - time.time()))
    torch.manual_seed(0)
    t_all = time.perf_counter()
    with torch.no_grad():
        a, b = torch.randn(8, 64, 96), torch.randn(8, 96, 80)
        bmm = torch.compile(lambda x, y: torch.bmm(x, y).relu(), mode="max-autotune-no-cudagraphs")
        bmm(a, b)
        inductor_config.freezing = True
        linear = torch.compile(torch.nn.Linear(128, 64).eval(), mode="max-autotune-no-cudagraphs")
        linear(torch.randn(32, 128))
    seconds = time.perf_counter() - t_all
    stats = tc_inductor.stats.as_dict()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "compile_seconds": seconds, "stats": stats}, f)
    return 0


def run_job(name: str, procs: int, tmp: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    start_at = time.time() + 10  # every process has imported torch by then
    children = []
    for i in range(procs):
        out = tmp / f"{name}-{i}.json"
        cache_dir = Path(tempfile.mkdtemp(prefix=f"inductor-{name}-{i}-", dir=tmp))
        child_env = {
            **env,
            "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
        }
        log = open(tmp / f"{name}-{i}.log", "w")  # noqa: SIM115 - closed with the child
        cmd = [sys.executable, __file__, "--worker", str(out), "--start-at", str(start_at)]
        children.append((subprocess.Popen(cmd, env=child_env, stdout=log, stderr=subprocess.STDOUT), out, log))
    results = []
    for i, (proc, out, log) in enumerate(children):
        rc = proc.wait()
        log.close()
        if rc != 0:
            sys.exit(f"{name} process {i} failed (rc={rc}); see {log.name}")
        results.append(json.loads(out.read_text()))
    return results


def report(name: str, results: list[dict[str, Any]]) -> tuple[float, int]:
    print(f"\n{name}: {len(results)} processes compiling at once")
    for i, r in enumerate(results):
        s = r["stats"]
        parts = [f"{e['op']}: {e['source']}" for e in s["events"] if e["source"] != "memo"]
        print(
            f"  process {i}: compile {r['compile_seconds']:6.1f}s, "
            f"{s['benchmarks']} GEMM benchmark(s) ({s['benchmark_seconds']:.1f}s)  [{', '.join(parts)}]"
        )
    benchmarks = sum(r["stats"]["benchmarks"] for r in results)
    mean = statistics.mean(r["compile_seconds"] for r in results)
    print(f"  -> {benchmarks} benchmark(s) in the job; mean compile {mean:.1f}s")
    return mean, benchmarks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, default=2, help="processes per job (default 2)")
    parser.add_argument("--fresh", action="store_true", help="use a temporary XDG_CACHE_HOME")
    parser.add_argument("--db", default=None, help="a TUNECACHE_DB to use instead of the default")
    parser.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.start_at)

    tmp = Path(tempfile.mkdtemp(prefix="tunecache-demo-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if args.fresh:
        # set here too: the default path is read from this process's environment below
        env["XDG_CACHE_HOME"] = os.environ["XDG_CACHE_HOME"] = str(tmp / "xdg-cache")
    if args.db:
        env["TUNECACHE_DB"] = args.db
    sys.path.insert(0, str(REPO))
    from tunecache.settings import Settings

    db_url = Settings.from_env(env).db_url  # what the children will resolve
    print(f"tunecache demo: database {db_url}; logs and results in {tmp}")
    print(f"{args.procs} processes per job x {KEYS_PER_PROCESS} GEMM keys (bmm, frozen Linear)")

    t0 = time.perf_counter()
    cold_mean, cold_bench = report("job 1 (first job)", run_job("job1", args.procs, tmp, env))
    warm_mean, warm_bench = report("job 2 (a later job, fresh Inductor caches)", run_job("job2", args.procs, tmp, env))

    without = 2 * args.procs * KEYS_PER_PROCESS
    print("\nsummary")
    print(f"  GEMM benchmarks: {cold_bench + warm_bench} with tunecache; {without} without "
          f"(every process of both jobs benchmarks every key)")
    print(f"  mean compile seconds per process: job 1 {cold_mean:.1f}s, job 2 {warm_mean:.1f}s "
          f"(saved {cold_mean - warm_mean:.1f}s per process in job 2)")
    if cold_bench == 0:
        print("  note: job 1 was already warm: the database held these keys from an earlier run "
              "(use --fresh for a cold start)")
    print(f"  demo wall time {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
