"""Benchmark `tunecache import` of a large export file, on SQLite and PostgreSQL.

    python tools/bench_import.py --backend sqlite --backend postgresql --lines 100000

Writes an export file of ``--lines`` entries shaped like Inductor's GEMM entries (the key
carries the full environment fingerprint, 4-24 candidates with Triton-like names, a
family and a meta object), then times the real command, `python -m tunecache.cli import
FILE --db URL`, into a fresh database per backend (migrated first, outside the timing),
and once more into the now full database (every line a conflict under --on-conflict keep).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_admin import _timings, key_of
from bench_store import FreshDatabase

import tunecache

REPO = Path(__file__).resolve().parent.parent


def write_file(path: Path, lines: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"format": "tunecache-export", "version": 1, "entries": lines,
                            "graphs": 0}) + "\n")
        for i in range(lines):
            timings = _timings(i)
            best = min(timings, key=timings.__getitem__)
            f.write(json.dumps({
                "key": key_of(i), "timings": timings, "best": best, "tune_seconds": 3.5,
                "created_at": 1.7e9, "updated_at": 1.7e9, "last_used_at": 1.7e9,
                "family": hashlib.sha256(str(i % 97).encode()).hexdigest(),
                "meta": {"baseline": {"candidate": "extern:mm", "ms": 1.5}},
            }, separators=(",", ":")) + "\n")


def timed_import(path: Path, url: str) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tunecache.cli", "import", str(path), "--db", url,
                    "--json"], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgresql"])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        path = Path(tmp) / "export.jsonl"
        write_file(path, args.lines)
        size = path.stat().st_size
        for backend in args.backend or ["sqlite", "postgresql"]:
            with FreshDatabase(backend, args.pg_admin, tmp) as url:
                tunecache.open(url).close()  # migrate outside the timing
                fresh = timed_import(path, url)
                again = timed_import(path, url)
            print(json.dumps({"backend": backend, "lines": args.lines, "file_bytes": size,
                              "import_s": round(fresh, 1), "again_keep_s": round(again, 1),
                              "lines_per_s": round(args.lines / fresh)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
