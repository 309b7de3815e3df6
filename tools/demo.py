"""tunecache's "main job" demo: CPU only, a SQLite database of its own, real max-autotune.

    python tools/demo.py               # 3 rounds, each on a fresh database in a temp dir
    python tools/demo.py --rounds 1    # the short form (make demo ROUNDS=1)
    python tools/demo.py --rounds 5    # more rounds: a tighter spread, a longer demo
    python tools/demo.py --db PATH     # an existing database instead (then job 1 may be warm)

The demo never touches the user's default cache ($XDG_CACHE_HOME/tunecache): every round
gets a fresh database file in a temporary directory, printed at the start and removed at
the end (--keep keeps it, with the logs). The last round's database is copied out first and
kept, with the ``tunecache stats/ls/show`` commands to try on it printed at the end. Ctrl-C
or SIGTERM ends the job processes and removes the temporary directory.

Every job starts ``--procs`` processes at once (think: ranks of one job) that each compile
a bmm and a frozen nn.Linear with ``torch.compile(mode="max-autotune-no-cudagraphs")``.
On CPU both really autotune (ATen vs the C++ template; mkl vs the C++ GEMM template).
Job 0 is the baseline: the same job with tunecache off (only a counter around Inductor's
benchmark). Job 1 is the first job with tunecache; job 2 is "a later job", the same again.
The demo prints what each process tuned and reused, and compares the jobs only on what it
measured in this run: compile seconds, GEMM benchmarks and the seconds they took.

One compile on cores that other work shares varies by tens of percent from run to run, so a
single sample can show tunecache 50% faster or slower. The three jobs therefore run
``--rounds`` times, interleaved so that a change in the machine's load hits every side
alike, and the side that runs first alternates (first, later, off; off, first, later; ...):
the first job after set-up pays for reading torch into the page cache, and in round 1 that
is a tunecache job, so one round never flatters tunecache. The summary gives the minimum,
median and maximum of every process's compile seconds per side, and calls a difference
noise when the ranges overlap. The last line is the run's result: GEMM benchmarks and the
seconds they took per job (summed over its processes), tunecache off against on; the
count of benchmarks does not depend on the machine's load, their seconds do.

Every process has its own fresh TORCHINDUCTOR_CACHE_DIR (as on a new node) and the FX
graph and AOTAutograd caches off, so each GEMM really reaches the autotuner, and only
tunecache can carry anything from one job to the next.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
KEYS_PER_PROCESS = 2  # bmm + packed_linear
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended
EXIT_TERMINATED = 143  # 128 + SIGTERM
# The job processes running now, ended by cleanup() when the demo is interrupted.
CHILDREN: list[subprocess.Popen[bytes]] = []
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class Terminated(BaseException):
    """SIGTERM, raised where the demo is, so that it cleans up as on Ctrl-C."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def worker(out: str, ready: str, go: str, tunecache_on: bool) -> int:
    """One process of a job: compile, then write what tunecache did as JSON."""
    import torch
    import torch._inductor.config as inductor_config

    import tunecache

    # Off, only the counter runs: Inductor's benchmarks are timed the same way in every job.
    tunecache.enable(count_only=not tunecache_on)
    # Start together, once every process of the job has imported torch.
    Path(ready).touch()
    deadline = time.monotonic() + 600
    while not Path(go).exists():
        if time.monotonic() > deadline:
            return 1  # the demo that started this process is gone
        time.sleep(0.01)
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
    stats = tunecache.stats().gemm.as_dict()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"pid": os.getpid(), "compile_seconds": seconds, "stats": stats}, f)
    return 0


def run_job(name: str, procs: int, tmp: Path, env: dict[str, str],
            tunecache_on: bool) -> list[dict[str, Any]]:
    go = tmp / f"{name}-go"
    children = []
    for i in range(procs):
        out, ready = tmp / f"{name}-{i}.json", tmp / f"{name}-{i}.ready"
        cache_dir = Path(tempfile.mkdtemp(prefix=f"inductor-{name}-{i}-", dir=tmp))
        child_env = {
            **env,
            "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
            # No pools of compile workers, which import torch again in every process:
            # the job's processes already fill the cores (and the demo's run time).
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
        }
        if not tunecache_on:  # nor its entry point, should --db have set TUNECACHE_DB
            child_env["TUNECACHE_MODE"] = "off"
        log = open(tmp / f"{name}-{i}.log", "w")  # noqa: SIM115 - closed with the child
        cmd = [sys.executable, __file__, "--worker", str(out), "--ready", str(ready),
               "--go", str(go)] + ([] if tunecache_on else ["--off"])
        # A stop signal between starting a child and recording it would leave it running.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            proc = subprocess.Popen(cmd, env=child_env, stdout=log, stderr=subprocess.STDOUT)
            CHILDREN.append(proc)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        children.append((proc, out, ready, log))
    while not all(ready.exists() for _, _, ready, _ in children):
        if any(proc.poll() is not None for proc, _, _, _ in children):
            break  # a child failed before starting: reported below
        time.sleep(0.05)
    go.touch()
    results = []
    for i, (proc, out, _, log) in enumerate(children):
        rc = proc.wait()
        CHILDREN.remove(proc)
        log.close()
        if rc != 0:
            sys.exit(f"{name} process {i} failed (rc={rc}); see {log.name}")
        results.append(json.loads(out.read_text()))
    return results


def report(name: str, results: list[dict[str, Any]]) -> None:
    print(f"\n{name}: {len(results)} processes compiling at once")
    for i, r in enumerate(results):
        s = r["stats"]
        parts = [f"{e['op']}: {e['source']}" for e in s["events"]
                 if e["source"] not in ("memo", "counted")]
        print(
            f"  process {i}: compile {r['compile_seconds']:6.1f}s, "
            f"{s['benchmarks']} GEMM benchmark(s) ({s['benchmark_seconds']:.1f}s)"
            + (f"  [{', '.join(parts)}]" if parts else "")
        )


def summary(results: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    """One side's processes over every round: compile seconds (min, median, max) and GEMM
    benchmarks per job (the mean over rounds)."""
    compile_s = [r["compile_seconds"] for r in results]
    return {
        "low": min(compile_s), "median": statistics.median(compile_s), "high": max(compile_s),
        "samples": len(compile_s),
        "benchmarks": sum(r["stats"]["benchmarks"] for r in results) / rounds,
        "benchmark_seconds": sum(r["stats"]["benchmark_seconds"] for r in results) / rounds,
    }


def against(job: dict[str, Any], off: dict[str, Any]) -> str:
    """``job``'s compile seconds against the tunecache-off job's, both measured here."""
    diff = job["median"] - off["median"]
    text = (f"median {abs(diff):.1f}s {'less' if diff < 0 else 'more'} compile per process "
            f"({diff / off['median']:+.0%})")
    if job["low"] <= off["high"] and off["low"] <= job["high"]:
        text += "; the ranges overlap, so this run cannot tell the two apart (noise)"
    return text


def count(n: float) -> str:
    """A per-job mean over rounds: whole when it is."""
    return f"{n:.0f}" if n == int(n) else f"{n:.1f}"


def result_line(off: dict[str, Any], first: dict[str, Any], later: dict[str, Any]) -> str:
    """What tunecache bought in this run, in one line: GEMM benchmarks and their seconds per
    job, tunecache off against on (the first job, then a later one)."""
    saved = off["benchmark_seconds"] - later["benchmark_seconds"]
    return (f"result: per job, tunecache off ran {count(off['benchmarks'])} GEMM benchmarks "
            f"({off['benchmark_seconds']:.1f}s); on, the first job ran "
            f"{count(first['benchmarks'])} ({first['benchmark_seconds']:.1f}s) and a later job "
            f"{count(later['benchmarks'])} ({later['benchmark_seconds']:.1f}s): "
            f"{abs(saved):.1f}s of benchmarking {'saved' if saved >= 0 else 'added'} "
            "in every later job")


def keep_database(db: Path) -> Path:
    """A copy of ``db`` outside the temporary directory, which is removed: SQLite's backup
    API copies a consistent database whatever its journal holds."""
    fd, name = tempfile.mkstemp(prefix="tunecache-demo-last-round-", suffix=".db")
    os.close(fd)
    src, dst = sqlite3.connect(db), sqlite3.connect(name)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return Path(name)


def tunecache_command() -> str:
    """The ``tunecache`` command of the Python running the demo (the project's virtual
    environment under `make demo`), as the user can type it from where they are: the
    environment is not activated, so a bare ``tunecache`` is not on PATH."""
    script = Path(sys.executable).parent / "tunecache"
    if script.exists():
        try:
            return shlex.quote(os.path.relpath(script) if script.is_relative_to(Path.cwd())
                               else str(script))
        except ValueError:
            return shlex.quote(str(script))
    return f"PYTHONPATH={shlex.quote(str(REPO))} {shlex.quote(sys.executable)} -m tunecache.cli"


def explore_commands(db: str, key_hash: str | None) -> list[str]:
    """The commands to try on the database the demo leaves, exactly as they can be typed."""
    cmd, where = tunecache_command(), shlex.quote(db)
    lines = [f"{cmd} stats --db {where}", f"{cmd} ls --db {where}"]
    if key_hash:
        lines.append(f"{cmd} show --db {where} {key_hash[:12]}")
    return lines


def cleanup(tmp: Path, keep: bool) -> None:
    """End the job processes still running (Ctrl-C reaches them too from a terminal, not
    when only the demo is signalled), wait for them, then remove the temporary directory
    they write to, unless ``keep``."""
    for proc in CHILDREN:
        if proc.poll() is None:
            proc.kill()
    for proc in CHILDREN:
        proc.wait()
    CHILDREN.clear()
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, default=2, help="processes per job (default 2)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times each job runs, for the spread (default 3; 1 is the "
                             "short form)")
    parser.add_argument("--db", default=None,
                        help="an existing TUNECACHE_DB to use for every round instead of a "
                             "fresh database per round")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (databases, logs)")
    parser.add_argument("--fresh", action="store_true", help=argparse.SUPPRESS)  # the default now
    parser.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--ready", help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    parser.add_argument("--off", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.ready, args.go, tunecache_on=not args.off)
    if args.rounds < 1 or args.procs < 1:
        parser.error("--rounds and --procs take a positive number")

    signal.signal(signal.SIGTERM, _raise_terminated)
    tmp = Path(tempfile.mkdtemp(prefix="tunecache-demo-"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    # Never the user's default cache: should a child fall back to the default database,
    # it is one in the temporary directory too.
    env["XDG_CACHE_HOME"] = str(tmp / "xdg-cache")
    if args.db:
        print(f"tunecache demo: database {args.db} (every round); logs in {tmp}", flush=True)
    else:
        print(f"tunecache demo: a fresh SQLite database per round in {tmp} "
              f"({'kept' if args.keep else 'removed at the end'})", flush=True)
    print(f"{args.procs} processes per job x {KEYS_PER_PROCESS} GEMM keys (bmm, frozen Linear), "
          f"fresh Inductor caches in every job, {args.rounds} round(s)", flush=True)

    try:
        db, key_hash, result = run_demo(args, tmp, env)
        kept = db if args.db else str(keep_database(Path(db)))
    except (KeyboardInterrupt, Terminated) as stop:
        # A second signal must not cut the clean-up short.
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        cleanup(tmp, args.keep)
        how = "Ctrl-C" if isinstance(stop, KeyboardInterrupt) else "SIGTERM"
        print(f"interrupted: the demo stopped ({how}); "
              + (f"kept {tmp}" if args.keep else f"removed {tmp}"), flush=True)
        return EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else EXIT_TERMINATED
    except BaseException:
        cleanup(tmp, keep=True)  # a job that failed names its log there
        raise
    cleanup(tmp, args.keep)
    if args.keep:
        print(f"  kept {tmp}")
    print(f"\nthe last round's database is {kept}; try:")
    for line in explore_commands(kept, key_hash):
        print(f"  {line}")
    print(result, flush=True)
    return 0


Job = tuple[str, str, bool]  # title, file name prefix, tunecache on


def round_order(r: int, off_job: Job, on_jobs: list[Job]) -> list[Job]:
    """Round ``r``'s jobs: the side that runs first alternates, and round 1 starts with
    tunecache, which so pays the first job's page-cache misses (one round never flatters
    it). The jobs with tunecache keep their order: the later job follows the first."""
    return [*on_jobs, off_job] if r % 2 else [off_job, *on_jobs]


def run_demo(args: argparse.Namespace, tmp: Path,
             env: dict[str, str]) -> tuple[str, str | None, str]:
    """The rounds of jobs and their summary; returns the last round's database, the hash of a
    key tuned in it and the result line."""
    t0 = time.perf_counter()
    off_job: Job = ("job 0 (tunecache off)", "job0", False)
    on_jobs: list[Job] = [
        ("job 1 (tunecache on, first job)", "job1", True),
        ("job 2 (tunecache on, a later job)", "job2", True),
    ]
    titles = [off_job[0]] + [title for title, _, _ in on_jobs]
    results: dict[str, list[dict[str, Any]]] = {title: [] for title in titles}
    db = args.db
    for r in range(1, args.rounds + 1):
        db = args.db or str(tmp / f"round{r}.db")
        round_env = {**env, "TUNECACHE_DB": db}
        for title, name, on in round_order(r, off_job, on_jobs):
            got = run_job(f"{name}-round{r}", args.procs, tmp, round_env, on)
            report(f"round {r}, {title}", got)
            results[title] += got
    measured = [(title, summary(results[title], args.rounds)) for title in titles]
    off = measured[0][1]

    print(f"\nsummary: compile seconds of every process over {args.rounds} round(s), "
          "all measured in this run")
    print(f"  {'':34} {'min':>6} {'median':>7} {'max':>6} {'GEMM benchmarks/job':>20} "
          f"{'benchmark s/job':>16}")
    for title, m in measured:
        print(f"  {title:34} {m['low']:6.1f} {m['median']:7.1f} {m['high']:6.1f} "
              f"{m['benchmarks']:20.1f} {m['benchmark_seconds']:16.1f}")
    for title, m in measured[1:]:
        print(f"  {title.split(' (')[0]} against job 0: {against(m, off)}")
    if measured[1][1]["benchmarks"] == 0:
        print("  note: job 1 was already warm: the database held these keys from an earlier run "
              "(leave out --db for a cold start)")
    print(f"  demo wall time {time.perf_counter() - t0:.0f}s")
    tuned = [e["key_hash"] for r in results[on_jobs[0][0]] for e in r["stats"]["events"]
             if e.get("key_hash")]
    return db, (tuned[-1] if tuned else None), result_line(off, measured[1][1], measured[2][1])


if __name__ == "__main__":
    sys.exit(main())
