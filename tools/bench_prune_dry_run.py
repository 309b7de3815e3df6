"""Benchmark `tunecache prune --older-than 30d --dry-run` as an operator runs it: the whole
CLI process, start included, on a cache where every entry matches.

    python tools/bench_prune_dry_run.py --backend sqlite --backend postgresql --entries 100000

For each backend, a fresh database of ``--entries`` rows (tools/bench_admin.py's rows),
every one last used 40 to 130 days ago, so that the dry run matches them all. Then the
dry run (text, and ``--json``) runs ``--repeat`` times; the best and the median wall time
are printed, with the count it reported.
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

from tunecache.store import Database, ensure_schema  # noqa: E402
from tunecache.store.schema import entries  # noqa: E402

DAY = 86400.0


def _old(i: int, now: float) -> dict[str, Any]:
    row = _row(i)
    last = now - (40 + i % 90) * DAY
    row.update(created_at=last - DAY, updated_at=last, last_used_at=last)
    if row["lease_expires_at"] is not None:
        row["lease_expires_at"] = last + 30
    return row


def build(url: str, count: int, chunk: int = 20_000) -> None:
    db = Database(url, 60)
    ensure_schema(db)
    now = time.time()
    for lo in range(0, count, chunk):
        rows = [_old(i, now) for i in range(lo, min(count, lo + chunk))]
        db.run(functools.partial(lambda c, rows: c.execute(entries.insert(), rows), rows=rows),
               write=True)
    db.run(lambda c: c.exec_driver_sql(
        "ANALYZE" if db.is_sqlite else "VACUUM ANALYZE tunecache_entries"))
    db.dispose()


def dry_run(url: str, *args: str, root: Path = ROOT) -> tuple[float, str]:
    # In the root: python -m puts the working directory first on the path.
    env = {**os.environ, "PYTHONPATH": str(root)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tunecache.cli", "prune", "--db", url,
                           "--older-than", "30d", "--dry-run", *args],
                          check=True, env=env, capture_output=True, text=True, cwd=root)
    return time.perf_counter() - started, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgresql"])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--compare", type=Path, default=None, metavar="ROOT",
                        help="also run the command of another checkout's tunecache (its "
                             "root directory) on each database, alternating with this one")
    args = parser.parse_args()
    roots = [ROOT] + ([args.compare.resolve()] if args.compare else [])
    with tempfile.TemporaryDirectory() as workdir:
        for backend in args.backend or ["sqlite"]:
            with FreshDatabase(backend, args.pg_admin, workdir) as url:
                started = time.perf_counter()
                build(url, args.entries)
                result: dict[str, Any] = {"backend": backend, "entries": args.entries,
                                          "build_s": round(time.perf_counter() - started, 1)}
                for label, extra in (("dry run", ()), ("dry run --json", ("--json",))):
                    runs: dict[Path, list[tuple[float, str]]] = {r: [] for r in roots}
                    for _ in range(args.repeat):  # alternated: a load that varies hits both
                        for r in roots:
                            runs[r].append(dry_run(url, *extra, root=r))
                    for r, name in zip(roots, ("", " (--compare)")):
                        times = [t for t, _ in runs[r]]
                        out = runs[r][-1][1]
                        would = (json.loads(out)["would_delete"] if extra
                                 else out.splitlines()[0])
                        result[label + name] = {
                            "best_s": round(min(times), 3),
                            "median_s": round(statistics.median(times), 3),
                            "said": would, "output_bytes": len(out)}
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
