"""Benchmark `tunecache stats` as an operator runs it: the whole CLI process, start included.

    python tools/bench_stats.py --backend sqlite --backend postgresql --entries 100000 \
        [--reports 100000] [--stats-args '--since 7d --by-day']

For each backend, a fresh database of ``--entries`` rows (tools/bench_admin.py's rows: GEMM
keys with the full environment, 4-24 candidates; 2% failed, 0.5% claimed), a third of the
done ones with a meta object (the untuned baseline and the best time) and a tenth of them
transferred (candidates benchmarked of those generated, and a regret on half of those).
Then ``python -m tunecache.cli stats --db URL`` (and ``--json``) runs ``--repeat`` times;
the best and the median wall time are printed. ``--profile FILE`` writes a cProfile of one
more run of the CLI's ``stats`` (in this process, start-up not included).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_admin import _row  # noqa: E402
from bench_store import FreshDatabase  # noqa: E402

from tunecache.store import Database, ensure_schema, gains  # noqa: E402
from tunecache.store.schema import entries, usage  # noqa: E402


def _meta(i: int) -> str | None:
    if i % 3:
        return None
    meta: dict[str, Any] = {"baseline": {"candidate": "extern:mm", "ms": 1.0 + i % 7},
                            "best_ms": 0.5 + i % 5 / 10}
    if i % 10 == 0:
        meta["transfer"] = {"from": ["0" * 64], "benchmarked": 3, "generated": 40}
        if i % 20 == 0:
            meta["regret"] = 1.0 + i % 9 / 100
    return json.dumps(meta, sort_keys=True)


def _rows(lo: int, hi: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(lo, hi):
        row = _row(i)
        row["meta_json"] = _meta(i) if row["state"] == "done" else None
        # As a writer stores them (publish, import): tunecache.store.gains.
        row.update(gains.values(row["kind"], row["timings_json"], row["meta_json"]))
        rows.append(row)
    return rows


def _reports(lo: int, hi: int, now: float) -> list[dict[str, Any]]:
    """Jobs' usage reports, spread evenly over the last 60 days."""
    return [{"recorded_at": now - i % 60 * 86400 - i % 86400, "host": f"node{i % 64}",
             "pid": i, "hits": i % 50, "tuned": i % 7, "peer": i % 3, "local": i % 2,
             "seconds_saved": i % 50 * 2.5, "seconds_tuning": i % 7 * 4.0}
            for i in range(lo, hi)]


def build(url: str, count: int, reports: int = 0, chunk: int = 20_000) -> None:
    db = Database(url, 60)
    ensure_schema(db)
    for lo in range(0, count, chunk):
        rows = _rows(lo, min(count, lo + chunk))
        db.run(functools.partial(lambda c, rows: c.execute(entries.insert(), rows), rows=rows),
               write=True)
    now = time.time()
    for lo in range(0, reports, chunk):
        rows = _reports(lo, min(reports, lo + chunk), now)
        db.run(functools.partial(lambda c, rows: c.execute(usage.insert(), rows), rows=rows),
               write=True)
    db.run(lambda c: c.exec_driver_sql(
        "ANALYZE" if db.is_sqlite else "VACUUM ANALYZE tunecache_entries"))
    db.dispose()


def wall(url: str, *args: str, root: Path = ROOT) -> float:
    # In the root: python -m puts the working directory first on the path.
    env = {**os.environ, "PYTHONPATH": str(root)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tunecache.cli", "stats", "--db", url, *args],
                   check=True, env=env, stdout=subprocess.DEVNULL, cwd=root)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgresql"])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--reports", type=int, default=0,
                        help="jobs' usage reports (tunecache_usage rows) over 60 days")
    parser.add_argument("--stats-args", default="",
                        help="more arguments of each stats run, such as '--since 7d --by-day'")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--compare", type=Path, default=None, metavar="ROOT",
                        help="also run the command of another checkout's tunecache (its "
                             "root directory) on each database, alternating with this one")
    parser.add_argument("--profile", default=None, help="write a cProfile of one stats call")
    args = parser.parse_args()
    roots = [ROOT] + ([args.compare.resolve()] if args.compare else [])
    with tempfile.TemporaryDirectory() as workdir:
        for backend in args.backend or ["sqlite"]:
            with FreshDatabase(backend, args.pg_admin, workdir) as url:
                started = time.perf_counter()
                build(url, args.entries, args.reports)
                built = time.perf_counter() - started
                result: dict[str, Any] = {"backend": backend, "entries": args.entries,
                                          "reports": args.reports, "build_s": round(built, 1)}
                more = tuple(args.stats_args.split())
                for label, extra in (("stats", ()), ("stats --json", ("--json",))):
                    times: dict[Path, list[float]] = {r: [] for r in roots}
                    for _ in range(args.repeat):  # alternated: a load that varies hits both
                        for r in roots:
                            times[r].append(wall(url, *extra, *more, root=r))
                    for r, name in zip(roots, ("", " (--compare)")):
                        result[label + name] = {"best_s": round(min(times[r]), 3),
                                                "median_s": round(statistics.median(times[r]),
                                                                  3)}
                if args.profile:
                    import cProfile

                    from click.testing import CliRunner

                    from tunecache.cli import cli

                    out = f"{args.profile}.{backend}"
                    cProfile.runctx("CliRunner().invoke(cli, ['stats', '--db', url])",
                                    globals(), {"CliRunner": CliRunner, "cli": cli, "url": url},
                                    out)
                    result["profile"] = out
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
