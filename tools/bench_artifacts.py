"""Benchmark compiled-graph storage: reading a large artifact, and what publishing them
does to the claims of running jobs.

    python tools/bench_artifacts.py --db sqlite --db postgresql://postgres@127.0.0.1:5432/test

For each --db, on a fresh database (SQLite: a new file in a temp directory unless a path is
given; PostgreSQL: a new database beside the one named, dropped at the end, unless
--pg-in-place):

(a) read: one artifact of --size-mb random (incompressible) bytes is published, then read
    --reads times, each by ArtifactStore.get as a job would (row, payload, sha256 check);
    median and max seconds (target: <= 0.5 s for 10 MB).
(b) claims: --claimers processes claim fresh tuning keys through ClaimStore.step (the claim
    write transaction every job runs), --claims each; p50/p99/max of one claim, first
    alone, then while --publishers processes publish --size-mb artifacts (fresh random
    bytes, fresh keys) without pause, and then while the same processes only hash and
    write (fsync) the same bytes to files, with no database: the control, the CPU and disk
    a publish costs on this machine whatever the store does. Claims with publishers close
    to the control: publishing holds no lock the claims wait for. --naive (SQLite) adds
    publishers that write their bytes inside a write transaction, the design avoided.

Prints one JSON document. Runs anywhere (CPU only).
"""

from __future__ import annotations

import argparse
import hashlib
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

from tunecache.keys import Key
from tunecache.settings import resolve_db_url
from tunecache.store import ArtifactStore, ClaimStore, Database, ensure_schema

SIG = b"\x00" * 64
ctx = mp.get_context("spawn")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": statistics.median(values), "p99": _pct(values, 0.99),
            "max": max(values), "mean": statistics.fmean(values)}


def bench_read(url: str, size: int, reads: int) -> dict[str, Any]:
    store = ArtifactStore(Database(url))
    payload = os.urandom(size)
    t0 = time.perf_counter()
    store.put("fxgraph", "bench-read", payload, SIG, "bench")
    put_seconds = time.perf_counter() - t0
    times = []
    for _ in range(reads):
        reader = ArtifactStore(Database(url))  # a job's first read: a fresh connection
        t0 = time.perf_counter()
        got = reader.get("fxgraph", "bench-read")
        times.append(time.perf_counter() - t0)
        assert got is not None and got.payload == payload
        reader.db.dispose()
    store.db.dispose()
    return {"bytes": size, "put_seconds": put_seconds, "get_seconds": _summary(times)}


def _claimer(url: str, claims: int, tag: str, barrier: Any, queue: Any) -> None:
    store = ClaimStore(Database(url))
    owner = f"bench:{os.getpid()}:{tag}"
    times = []
    barrier.wait()
    started = time.perf_counter()
    for i in range(claims):
        key = Key.of({"kind": "bench", "op": "claim", "tag": tag, "pid": os.getpid(), "i": i})
        t0 = time.perf_counter()
        out = store.step(publish=[], candidates=[key], limit=1, owner=owner,
                         lease_seconds=60, max_attempts=3)
        times.append(time.perf_counter() - t0)
        assert len(out.claimed) == 1
    queue.put({"claims": times, "elapsed": time.perf_counter() - started})
    store.db.dispose()


def _write_under_the_lock(db: Database, path: str, payload: bytes) -> None:
    """The design tunecache avoids, for comparison: the payload written (and fsynced)
    while the transaction holds SQLite's write lock, as a BLOB column would be."""

    def work(_conn: Any) -> None:
        with open(path, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())

    db.run(work, write=True)


def _write_file_only(path: str, payload: bytes) -> None:
    """The control: the same bytes hashed and written (and fsynced) with no database."""
    hashlib.sha256(payload).hexdigest()
    with open(path, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def _publisher(url: str, size: int, mode: str, stop: Any, barrier: Any,
               queue: Any) -> None:
    store = ArtifactStore(Database(url))
    published = 0
    seconds = 0.0
    scratch = os.path.join(os.path.dirname(store.db.sqlite_path or os.path.join(
        tempfile.gettempdir(), "x")), f"bench-scratch-{os.getpid()}")
    barrier.wait()
    started = time.perf_counter()
    while not stop.is_set():
        payload = os.urandom(size)  # fresh bytes: a content-addressed write is never skipped
        t0 = time.perf_counter()
        if mode == "inside_lock":
            _write_under_the_lock(store.db, scratch, payload)
        elif mode == "files_only":
            _write_file_only(scratch, payload)
        else:
            assert store.put("fxgraph", f"bench-{os.getpid()}-{published}", payload, SIG,
                             "bench")
        seconds += time.perf_counter() - t0
        published += 1
    if mode != "store":
        os.unlink(scratch)
    queue.put({"published": published, "put_seconds": seconds,
               "elapsed": time.perf_counter() - started})
    store.db.dispose()


def bench_claims(url: str, claimers: int, claims: int, publishers: int,
                 size: int, mode: str = "store") -> dict[str, Any]:
    barrier = ctx.Barrier(claimers + publishers)
    queue, stop = ctx.Queue(), ctx.Event()
    tag = uuid.uuid4().hex[:8]
    procs = [ctx.Process(target=_claimer, args=(url, claims, tag, barrier, queue))
             for _ in range(claimers)]
    procs += [ctx.Process(target=_publisher, args=(url, size, mode, stop, barrier, queue))
              for _ in range(publishers)]
    for p in procs:
        p.start()
    results = []
    claim_reports = 0
    while claim_reports < claimers:
        r = queue.get(timeout=600)
        results.append(r)
        claim_reports += "claims" in r
    stop.set()
    while len(results) < claimers + publishers:
        results.append(queue.get(timeout=600))
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise SystemExit(f"a benchmark process failed (exit code {p.exitcode})")
    times = [t for r in results for t in r.get("claims", [])]
    wall = max(r["elapsed"] for r in results if "claims" in r)
    out: dict[str, Any] = {"claimers": claimers, "publishers": publishers,
                           "claim_seconds": _summary(times), "claim_phase_seconds": wall}
    if publishers:
        n = sum(r["published"] for r in results if "published" in r)
        put = sum(r["put_seconds"] for r in results if "published" in r)
        pub_wall = max(r["elapsed"] for r in results if "published" in r)
        out["published"] = n
        out["published_mb_per_s"] = n * size / 2**20 / pub_wall
        out["put_seconds_mean"] = put / n if n else None
    return out


def _open(spec: str, workdir: str, in_place: bool) -> tuple[str, Any]:
    """(URL of a fresh database for ``spec``, cleanup)."""
    if spec == "sqlite":
        return f"sqlite:///{workdir}/bench.db", lambda: None
    url = resolve_db_url(spec)
    if not url.startswith("postgresql") or in_place:
        return url, lambda: None
    import psycopg

    name = f"tunecache_bench_{uuid.uuid4().hex[:10]}"
    admin = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return url.rsplit("/", 1)[0] + "/" + name, drop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", action="append", required=True,
                        help="'sqlite' (a temp file), a SQLite path or URL, or a postgresql:// "
                             "URL (a fresh database is created beside it); repeatable")
    parser.add_argument("--size-mb", type=float, default=10.0)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--claims", type=int, default=100, help="claims per claimer")
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--naive", action="store_true",
                        help="SQLite: also measure claims while publishers write their bytes "
                             "inside a write transaction (the design tunecache avoids)")
    parser.add_argument("--pg-in-place", action="store_true",
                        help="use the PostgreSQL database named as it is (its tables stay)")
    args = parser.parse_args()
    size = int(args.size_mb * 2**20)
    report: dict[str, Any] = {
        "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "size_mb": args.size_mb, "results": []}
    for spec in args.db:
        with tempfile.TemporaryDirectory(prefix="bench-artifacts-") as workdir:
            url, cleanup = _open(spec, workdir, args.pg_in_place)
            try:
                db = Database(url)
                ensure_schema(db)
                db.dispose()
                read = bench_read(url, size, args.reads)
                alone = bench_claims(url, args.claimers, args.claims, 0, size)
                busy = bench_claims(url, args.claimers, args.claims, args.publishers, size)
                control = bench_claims(url, args.claimers, args.claims, args.publishers,
                                       size, mode="files_only")
                naive = (bench_claims(url, args.claimers, args.claims, args.publishers, size,
                                      mode="inside_lock")
                         if args.naive and url.startswith("sqlite") else None)
            finally:
                cleanup()

        def ratio(b: dict[str, Any], a: dict[str, Any] = alone) -> dict[str, float]:
            x, y = b["claim_seconds"], a["claim_seconds"]
            return {q: x[q] / y[q] for q in ("p50", "p99", "max")}

        result = {"backend": Database(url).dialect, "db": spec, "read": read,
                  "claims_alone": alone, "claims_with_publishers": busy,
                  "ratio_with_publishers": ratio(busy),
                  "claims_with_file_writers": control,
                  "ratio_with_file_writers": ratio(control)}
        if naive is not None:
            result["claims_with_publishers_inside_lock"] = naive
            result["ratio_inside_lock"] = ratio(naive)
        report["results"].append(result)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
