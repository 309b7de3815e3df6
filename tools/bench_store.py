"""Benchmark the store: done-key lookups and claim+tune+publish throughput, many processes.

    python tools/bench_store.py --backend sqlite --backend postgresql --procs 1 8 32

For each backend and process count, on a fresh database:
- throughput: every process calls get_or_tune_many on the same K keys with a no-op tuner;
  keys/s = K / wall time of the slowest process. Checks that each key was tuned exactly
  once and that every process got identical results.
- lookup: every process looks up done keys in a loop; p50/p99 of one lookup.
- errors: exceptions, local fallbacks, or a key tuned twice (target: zero).

PostgreSQL: --pg-admin names a database whose user may CREATE DATABASE (trust auth here).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tunecache


def _noop_tuner(key: Any) -> dict[str, float]:
    return {"aten": 1.0 + (hash(key.mapping["i"]) % 7) * 0.01, "triton": 1.02}


def _throughput_worker(url: str, keys: int, barrier: Any, queue: Any) -> None:
    cache = tunecache.open(url, lease_seconds=30)
    key_list = [{"kind": "bench", "op": "mm", "i": i} for i in range(keys)]
    barrier.wait()
    start = time.perf_counter()
    try:
        results = cache.get_or_tune_many(key_list, _noop_tuner)
        errors = sum(r.source in ("local", "failed") for r in results)
        tuned = sum(r.source == "tuned" for r in results)
        bests = [r.best for r in results]
    except Exception as e:  # noqa: BLE001 - counted as an error, reported
        errors, tuned, bests = keys, 0, [repr(e)]
    queue.put({"seconds": time.perf_counter() - start, "errors": errors, "tuned": tuned,
               "bests": bests})
    cache.close()


def _lookup_worker(url: str, keys: int, lookups: int, barrier: Any, queue: Any) -> None:
    cache = tunecache.open(url)
    key_list = [{"kind": "bench", "op": "mm", "i": i} for i in range(keys)]
    cache.lookup(key_list[0])  # connect and check the schema outside the timing
    barrier.wait()
    times, errors = [], 0
    for n in range(lookups):
        start = time.perf_counter()
        result = cache.lookup(key_list[n % keys])
        times.append(time.perf_counter() - start)
        errors += result is None
    queue.put({"times": times, "errors": errors})
    cache.close()


def _run(target: Any, procs: int, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=target, args=(*args, barrier, queue)) for _ in range(procs)]
    for w in workers:
        w.start()
    out = [queue.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    return out


class FreshDatabase:
    """A fresh database per measurement: a new SQLite file, or a new PostgreSQL database
    (created through ``pg_admin``, dropped on exit). Yields its URL."""

    def __init__(self, backend: str, pg_admin: str, workdir: str) -> None:
        self.backend, self.pg_admin, self.workdir = backend, pg_admin, workdir
        self.name = ""

    def __enter__(self) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{self.workdir}/bench-{uuid.uuid4().hex[:8]}.db"
        import psycopg

        self.name = f"tunecache_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.pg_admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return f"{self.pg_admin.rsplit('/', 1)[0]}/{self.name}"

    def __exit__(self, *exc: object) -> None:
        if self.name:
            import psycopg

            with psycopg.connect(self.pg_admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def measure(backend: str, procs: int, keys: int, lookups: int, pg_admin: str,
            workdir: str) -> dict[str, Any]:
    with FreshDatabase(backend, pg_admin, workdir) as url:
        tunecache.open(url).close()  # migrate once, outside the timing
        runs = _run(_throughput_worker, procs, (url, keys))
        wall = max(r["seconds"] for r in runs)
        tuned = sum(r["tuned"] for r in runs)
        agree = all(r["bests"] == runs[0]["bests"] for r in runs)
        errors = sum(r["errors"] for r in runs) + abs(tuned - keys) + (0 if agree else 1)
        looks = _run(_lookup_worker, procs, (url, keys, lookups))
        times = sorted(t for r in looks for t in r["times"])
        errors += sum(r["errors"] for r in looks)
    return {
        "backend": backend,
        "procs": procs,
        "keys": keys,
        "keys_per_s": keys / wall,
        "tuned_total": tuned,
        "tuned_max_per_proc": max(r["tuned"] for r in runs),
        "lookup_p50_ms": statistics.median(times) * 1e3,
        "lookup_p99_ms": times[int(len(times) * 0.99) - 1] * 1e3,
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgresql"])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--lookups", type=int, default=2000, help="per process")
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--dir", default=None, help="where SQLite files go (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args()
    backends = args.backend or ["sqlite", "postgresql"]
    with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
        rows = [measure(b, p, args.keys, args.lookups, args.pg_admin, workdir)
                for b in backends for p in args.procs]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, tunecache {tunecache.__version__}")
    print("| backend | procs | keys | claim+tune+publish keys/s | tuned (max/proc) "
          "| lookup p50 ms | lookup p99 ms | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['procs']} | {r['keys']} | {r['keys_per_s']:.0f} "
              f"| {r['tuned_total']} ({r['tuned_max_per_proc']}) | {r['lookup_p50_ms']:.3f} "
              f"| {r['lookup_p99_ms']:.3f} | {r['errors']} |")


if __name__ == "__main__":
    main()
