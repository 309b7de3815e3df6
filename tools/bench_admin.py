"""Benchmark the operator commands on a large cache: stats, and a prune under live traffic.

    python tools/bench_admin.py --backend sqlite --backend postgresql --entries 1000000

For each backend, on a fresh database:
- build: ``--entries`` rows bulk-inserted with SQLAlchemy Core executemany in big
  transactions (not through the claim protocol: a million claims would take hours and
  measure nothing new). Rows look like Inductor's: the key carries the full environment
  fingerprint and an inputs_key, timings have 4-24 candidates with Triton-like names;
  4 devices x 3 torch x 2 triton, 4 ops, 2% failed, 0.5% claimed; last use spread evenly
  over 90 days.
- stats: `tunecache stats`'s library call (ops.stats), best of 3 (target <= 2 s);
  again with the covering index proposed for the schema (created, measured, dropped).
- prune: `prune --older-than 45d` (about half of the rows), no VACUUM (target <= 30 s);
  then VACUUM measured on its own (SQLite: gives the file back; PostgreSQL: plain VACUUM).
- while the prune runs, from other processes: TuneCache.lookup of random surviving keys
  (p50/p99, errors: exceptions, misses of surviving keys, or the cache turning itself
  off), and a writer claiming+publishing new keys (get_or_tune_many latency p50/p99/max).

PostgreSQL: --pg-admin names a database whose user may CREATE DATABASE (trust auth here).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tunecache
from tunecache import ops
from tunecache.keys import canonical_json, key_labels, timings_to_json
from tunecache.ops import pruning as prune_mod
from tunecache.ops import statistics as stats_mod
from tunecache.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import FreshDatabase

from tunecache.store import Database, ensure_schema
from tunecache.store.schema import entries

DAY = 86400.0
DEVICES = ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"]
TORCH = ["2.11.0+cu128", "2.12.0+cu128", "2.13.0+cu130"]
TRITON = ["3.4.0", "3.5.1"]
OPS = ["mm", "addmm", "bmm", "baddbmm"]
# Fixed "now" for the whole run: row ages are relative to the build's start.
_NOW = time.time()


def _env(i: int) -> dict[str, str]:
    env = {
        "device": DEVICES[i % 4], "capability": "9.0", "device_type": "cuda",
        "torch": TORCH[(i // 4) % 3], "triton": TRITON[(i // 12) % 2], "cuda": "12.8",
        "hip": "none", "fp16_reduced_reduction": "True", "bf16_reduced_reduction": "True",
    }
    for flag, value in (("max_autotune_gemm_backends", "ATEN,TRITON"),
                        ("max_autotune_gemm_search_space", "DEFAULT"),
                        ("max_autotune_conv_backends", "ATEN,TRITON"),
                        ("emulate_precision_casts", "False"), ("cpu_backend", "cpp"),
                        ("cuda_backend", "triton"), ("cpp.simdlen", "None"),
                        ("triton.enable_persistent_tma_matmul", "False"),
                        ("triton.use_tensor_descriptor", "False")):
        env[f"inductor.{flag}"] = value
    return env


def key_of(i: int) -> dict[str, Any]:
    """Entry i's key: deterministic, so other processes can look it up."""
    rng = random.Random(i)
    m, n, k = (rng.choice([128, 256, 512, 1024, 2048, 4096, 8192]) for _ in range(3))
    op = OPS[(i // 24) % 4]
    mats = [("cuda", "torch.bfloat16", m, k, k, 1, 0), ("cuda", "torch.bfloat16", k, n, n, 1, 0)]
    return {"kind": "gemm", "op": op, "env": _env(i), "precision": "highest",
            "hint_override": None, "inputs": repr(mats), "n": i}


def _timings(i: int) -> dict[str, float]:
    rng = random.Random(-i)
    out = {"extern:mm-" + hashlib.sha256(str(i).encode()).hexdigest()[:52]: rng.uniform(0.05, 2)}
    for c in range(rng.randint(3, 23)):
        out[f"triton:triton_mm:BLOCK_M={16 << c % 4}, BLOCK_N={32 << c % 3}, BLOCK_K=64, "
            f"num_stages={c % 5 + 1}, num_warps={4 << c % 2}"] = rng.uniform(0.05, 2)
    return out


def age_days(i: int) -> float:
    return (i * 37 % 9000) / 100.0  # 0 .. 90 days, evenly


def _insert(conn: Any, rows: list[dict[str, Any]]) -> None:
    conn.execute(entries.insert(), rows)


def _row(i: int) -> dict[str, Any]:
    key = key_of(i)
    text = canonical_json(key)
    timings = _timings(i)
    state = "failed" if i % 50 == 7 else ("claimed" if i % 200 == 3 else "done")
    last = _NOW - age_days(i) * DAY
    best = min(timings, key=timings.__getitem__)
    return {
        "key_hash": hashlib.sha256(text.encode()).hexdigest(), "key_json": text,
        **key_labels(key), "state": state, "owner": f"node{i % 64}:{i}:abcd1234",
        "token": 1, "attempts": 1,
        # claims in the bench are long dead (their leases passed), like after a crash
        "lease_expires_at": last + 30 if state == "claimed" else None,
        "timings_json": timings_to_json(timings) if state == "done" else None,
        "best": best if state == "done" else None,
        "tune_seconds": 1.0 + i % 17 if state == "done" else None,
        "error": "RuntimeError: CUDA error" if state == "failed" else None,
        "created_at": last - DAY, "updated_at": last, "last_used_at": last,
        "hits": i % 13,
    }


def build(url: str, count: int, chunk: int = 50_000) -> float:
    db = Database(url, 60)
    ensure_schema(db)
    started = time.perf_counter()
    for lo in range(0, count, chunk):
        rows = [_row(i) for i in range(lo, min(count, lo + chunk))]
        db.run(functools.partial(_insert, rows=rows), write=True)
        print(f"  built {min(count, lo + chunk)}/{count} ({time.perf_counter() - started:.0f}s)",
              file=sys.stderr)
    if db.is_sqlite:
        db.run(lambda c: c.exec_driver_sql("ANALYZE"))
    else:
        db.run(lambda c: c.exec_driver_sql("VACUUM ANALYZE tunecache_entries"))
    db.dispose()
    return time.perf_counter() - started


def _lookup_worker(url: str, count: int, stop: Any, queue: Any) -> None:
    cache = tunecache.open(url, lease_seconds=120, lock_timeout=60)
    survivors = [i for i in range(0, count, 97) if i % 50 != 7 and i % 200 != 3
                 and age_days(i) < 40]
    keys = [key_of(i) for i in survivors[:5000]]
    cache.lookup(keys[0])
    rng = random.Random(os.getpid())
    times, errors = _timed_until(stop, lambda: cache.lookup(rng.choice(keys)) is not None,
                                 pause=0.002)
    errors += cache.disabled_reason is not None
    queue.put({"kind": "lookup", "times": times, "errors": errors})
    cache.close()


def _writer_worker(url: str, stop: Any, queue: Any) -> None:
    cache = tunecache.open(url, lease_seconds=120, lock_timeout=60)
    numbers = itertools.count()

    def claim_tune_publish() -> bool:
        key = {"kind": "bench-writer", "op": "mm", "pid": os.getpid(), "n": next(numbers)}
        return cache.get_or_tune_many([key], lambda _k: {"aten": 1.0})[0].source == "tuned"

    times, errors = _timed_until(stop, claim_tune_publish, pause=0.01)
    errors += cache.disabled_reason is not None
    queue.put({"kind": "writer", "times": times, "errors": errors})
    cache.close()


def _timed_until(stop: Any, call: Callable[[], bool],
                 pause: float) -> tuple[list[tuple[float, float]], int]:
    """Call ``call`` every ``pause`` seconds until ``stop`` is set: (when, seconds) of each
    call, and how many failed (returned False or raised)."""
    times: list[tuple[float, float]] = []
    errors = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            errors += not call()
        except Exception:  # noqa: BLE001 - counted
            errors += 1
        times.append((time.time(), time.perf_counter() - t0))
        time.sleep(pause)
    return times, errors


def _pct(times: list[float], q: float) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, int(len(s) * q))] * 1e3 if s else float("nan")


def measure(backend: str, count: int, pg_admin: str, workdir: str, lookers: int,
            sqlite_base: str | None = None, batch: int | None = None,
            pause: bool = True) -> dict[str, Any]:
    with FreshDatabase(backend, pg_admin, workdir) as url:
        path = url[len("sqlite:///"):] if backend == "sqlite" else ""
        if sqlite_base and backend == "sqlite" and os.path.exists(sqlite_base):
            print(f"{backend}: copying {sqlite_base}", file=sys.stderr)
            shutil.copyfile(sqlite_base, path)
            build_s = float("nan")
        else:
            print(f"{backend}: building {count} entries", file=sys.stderr)
            build_s = build(url, count)
            if sqlite_base and backend == "sqlite":
                shutil.copyfile(path, sqlite_base)
        settings = Settings.from_env(db=url, lease_seconds=120, lock_timeout=60)
        db = ops.open_database(settings)
        size = stats_mod.database_size(db)["bytes"]
        stats_times = []
        for _ in range(3):
            t0 = time.perf_counter()
            data = ops.stats(db)
            stats_times.append(time.perf_counter() - t0)
        assert data.entries.total == count, data.entries
        if not db.is_sqlite:
            # Fresh bulk-loaded tables have no statistics yet; a real cache has them.
            db.run(lambda c: c.exec_driver_sql("VACUUM ANALYZE tunecache_entries"))
            t0 = time.perf_counter()
            ops.stats(db)
            stats_times.append(time.perf_counter() - t0)

        ctx = mp.get_context("spawn")
        stop, queue = ctx.Event(), ctx.Queue()
        workers = [ctx.Process(target=_lookup_worker, args=(url, count, stop, queue))
                   for _ in range(lookers)]
        workers.append(ctx.Process(target=_writer_worker, args=(url, stop, queue)))
        for w in workers:
            w.start()
        time.sleep(5)  # workers import, connect, and start looping
        t0 = time.perf_counter()
        window = [time.time()]
        report = ops.prune(db, ops.PruneSpec(older_than=45 * DAY),
                                   vacuum="never", batch=batch, pause=pause)
        prune_s = time.perf_counter() - t0
        window.append(time.time())
        time.sleep(0.5)
        stop.set()
        results = [queue.get(timeout=120) for _ in workers]
        for w in workers:
            w.join()
        t0 = time.perf_counter()
        prune_mod.run_vacuum(db, "always", report.deleted or 0)
        vacuum_s = time.perf_counter() - t0
        size_after = stats_mod.database_size(db)["bytes"]
        db.dispose()
    # Only the operations that ended while the prune ran (errors are counted throughout).
    def during(kind: str) -> list[float]:
        return [s for r in results if r["kind"] == kind for when, s in r["times"]
                if window[0] <= when <= window[1]]

    lookups, writes = during("lookup"), during("writer")
    return {
        "backend": backend, "entries": count,
        # Rows per batch: the size asked for, else the largest of the sizes prune chose.
        "batch": batch or report.largest_batch, "pause": pause,
        "build_s": build_s, "size_mb": size / 2**20,
        "stats_s": min(stats_times), "deleted": report.deleted, "batches": report.batches,
        "prune_s": prune_s, "vacuum_s": vacuum_s, "size_after_mb": size_after / 2**20,
        "lookups": len(lookups), "lookup_p50_ms": _pct(lookups, 0.5),
        "lookup_p99_ms": _pct(lookups, 0.99), "lookup_max_ms": _pct(lookups, 1.0),
        "writes": len(writes), "write_p50_ms": _pct(writes, 0.5),
        "write_p99_ms": _pct(writes, 0.99), "write_max_ms": _pct(writes, 1.0),
        "errors": sum(r["errors"] for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgresql"])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--lookup-procs", type=int, default=1)
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--dir", default=None, help="where SQLite files go (default: a temp dir)")
    parser.add_argument("--sqlite-base", default=None,
                        help="reuse this built SQLite file (copied per run); built there if "
                             "missing. Its entry count must match --entries.")
    parser.add_argument("--batch", type=int, default=None,
                        help="prune --batch-size (default: prune's own)")
    parser.add_argument("--no-pause", action="store_true", help="prune --no-pause")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args()
    backends = args.backend or ["sqlite", "postgresql"]
    with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
        rows = [measure(b, args.entries, args.pg_admin, workdir, args.lookup_procs,
                        args.sqlite_base, args.batch, not args.no_pause) for b in backends]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, tunecache {tunecache.__version__}")
    print("| backend | batch (largest), pause | entries | size MB | build s | stats s "
          "| prune: deleted / batches / s "
          "| VACUUM s (size after MB) | lookups during prune: n / p50 / p99 / max ms "
          "| claim+publish during prune: n / p50 / p99 / max ms | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        pause = "yes" if r["pause"] else "no"
        print(f"| {r['backend']} | {r['batch']}, {pause} | {r['entries']} "
              f"| {r['size_mb']:.0f} | {r['build_s']:.0f} "
              f"| {r['stats_s']:.2f} | {r['deleted']} / {r['batches']} / {r['prune_s']:.1f} "
              f"| {r['vacuum_s']:.1f} ({r['size_after_mb']:.0f}) "
              f"| {r['lookups']} / {r['lookup_p50_ms']:.2f} / {r['lookup_p99_ms']:.2f} / "
              f"{r['lookup_max_ms']:.0f} | {r['writes']} / {r['write_p50_ms']:.1f} / "
              f"{r['write_p99_ms']:.1f} / {r['write_max_ms']:.0f} | {r['errors']} |")


if __name__ == "__main__":
    main()
