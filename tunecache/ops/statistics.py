"""What `tunecache stats` reports: entries by state, environment and op; size; hits; time
saved; claims in flight; failed keys; what tuning bought and how transferred entries did.
One JSON-able dict."""

from __future__ import annotations

import heapq
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from ..keys import MAX_TIMINGS_BYTES, validate_meta
from ..store import ArtifactStore, Database, admin, columns
from ..store.migrate import current_revision
from .entries import pages

__all__ = ["stats", "database_size", "graph_stats", "gains", "GAINS_ROWS", "TOP_KEYS"]

# "What tuning bought" reads each done entry's meta (and a GEMM's timings): past this many
# rows it stops, and says so. Rows are read in key hash order, which is random with
# respect to everything else, so a partial read is a uniform sample. Measured on a
# million-entry SQLite cache (tools/bench_admin.py's rows, 2 shared cores): 100k rows
# took 1.0 s to read and 1.6 s to parse; 50k keep `stats` within its 2 s.
GAINS_ROWS = 50_000
GAINS_PAGE = 2000
TOP_KEYS = 10


def database_size(db: Database) -> dict[str, Any]:
    """The database's size in bytes, and (SQLite) how many of them are free pages."""
    if db.is_sqlite:
        path = db.sqlite_path or ""
        pages, free, page_size = db.run(admin.sqlite_size)
        return {
            "bytes": os.path.getsize(path) if os.path.exists(path) else pages * page_size,
            "free_bytes": int(free) * int(page_size),
        }
    return {"bytes": db.run(admin.pg_database_size),
            "free_bytes": None}


def graph_stats(db: Database) -> dict[str, Any]:
    """Compiled graphs: count and payload bytes, in all and by kind, by torch version,
    and by both; on SQLite also what the blob directory holds (orphans included: a blob
    whose row a prune has not yet removed, or whose publisher died)."""
    store = ArtifactStore(db)
    groups = store.stats()
    by_kind: dict[Any, dict[str, Any]] = {}
    by_torch: dict[Any, dict[str, Any]] = {}
    for g in groups:
        for table, name, value in ((by_kind, "kind", g["kind"]), (by_torch, "torch", g["torch"])):
            row = table.setdefault(value, {name: value, "count": 0, "bytes": 0, "invalid": 0,
                                           "hits": 0})
            row["count"] += g["count"]
            row["bytes"] += g["bytes"]
            row["invalid"] += g["invalid"]
            row["hits"] += g["hits"]

    def order(row: dict[str, Any]) -> tuple[int, str]:
        return (-row["bytes"], json.dumps(row, sort_keys=True, default=str))

    report: dict[str, Any] = {
        "count": sum(g["count"] for g in groups),
        "bytes": sum(g["bytes"] for g in groups),
        # Rows whose size no tunecache writes: counted here, summed nowhere; prune
        # --max-graph-bytes removes them first.
        "invalid": sum(g["invalid"] for g in groups),
        "hits": sum(g["hits"] for g in groups),  # loads by jobs
        "by_kind": sorted(by_kind.values(), key=order),
        "by_torch": sorted(by_torch.values(), key=order),
        "groups": sorted(groups, key=order),
    }
    if store.blobs is not None:
        report["blob_dir"] = {"path": store.blobs.root, **store.blobs.usage()}
    return report


def _ms(value: Any) -> float | None:
    """A time in ms read from meta or timings: a finite positive number, else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) and value > 0 else None


def _from_timings(raw: Any) -> tuple[float | None, float | None, str | None]:
    """A GEMM's (baseline ms, best ms, baseline candidate) from its timings: the fastest
    extern (ATen) candidate, the choice Inductor makes without tuning, and the fastest of
    all; Nones for timings that are no JSON object.

    Lighter than keys.validate_timings, which checks every name as a store would need it
    (measured: 80% of this section's time on a million entries): nothing here is stored
    or run, a name is only compared and then printed escaped, and a value counts only if
    it is a finite positive number.
    """
    if not isinstance(raw, str) or len(raw) > MAX_TIMINGS_BYTES:
        return None, None, None
    try:
        timings = json.loads(raw)
    except (ValueError, RecursionError):
        return None, None, None
    if not isinstance(timings, dict):
        return None, None, None
    best = baseline = None
    name = None
    for candidate, ms in timings.items():
        # type(), not isinstance: a bool is no time; NaN and inf fail the range test.
        if type(ms) not in (float, int) or not 0 < ms < math.inf:
            continue
        if best is None or ms < best:
            best = ms
        if candidate.startswith("extern:") and (baseline is None or ms < baseline):
            baseline, name = ms, candidate
    return (None if baseline is None else float(baseline),
            None if best is None else float(best), name)


def _entry_gain(row: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(meta, gain) of one row: gain None when the entry has no usable baseline."""
    meta = validate_meta(columns.text(row.meta_json))
    given = meta.get("baseline")
    baseline = _ms(given.get("ms")) if isinstance(given, dict) else None
    candidate = given.get("candidate") if isinstance(given, dict) else None
    best = _ms(meta.get("best_ms"))
    source = "meta"
    if row.kind == "gemm" and (baseline is None or best is None):
        # Entries tuned before meta existed: both times are in the timings.
        t_base, t_best, t_name = _from_timings(row.timings_json)
        if baseline is None:
            baseline, candidate = t_base, t_name
        best = best if best is not None else t_best
        source = "timings"
    if baseline is None or best is None:
        return meta, None
    seconds = columns.time(row.tune_seconds)
    return meta, {
        "key_hash": row.key_hash, "kind": row.kind, "op": row.op,
        "baseline_candidate": candidate if isinstance(candidate, str) else None,
        "baseline_ms": baseline, "best_ms": best, "speedup": baseline / best,
        "ms_saved_per_call": baseline - best,
        "tune_seconds": seconds if seconds is not None and seconds >= 0 else 0.0,
        "hits": columns.integer(row.hits) or 0, "from": source,
    }


def _gain_row(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {**fields, "entries": 0, "baseline_ms": 0.0, "best_ms": 0.0, "tune_seconds": 0.0}


def _finish_gain(row: dict[str, Any]) -> dict[str, Any]:
    row["speedup"] = row["baseline_ms"] / row["best_ms"] if row["best_ms"] > 0 else None
    row["ms_saved_per_call"] = row["baseline_ms"] - row["best_ms"]
    return row


def _transfer_row(kind: Any) -> dict[str, Any]:
    return {"kind": kind, "entries": 0, "benchmarked": 0, "generated": 0,
            "regret_measured": 0, "regret_mean": None, "regret_max": None, "_sum": 0.0}


def gains(db: Database, *, max_rows: int | None = GAINS_ROWS,
          top: int = TOP_KEYS) -> dict[str, Any]:
    """What tuning bought and how transferred entries did, from the done entries' meta
    (and, for GEMM entries without it, their timings).

    Per kind and per op: the entries with a baseline (the untuned choice's time), the
    sums of their baseline and best times (one call of each), the speedup and ms saved
    per call, and the tuning time that found them; the ``top`` keys by ms saved per call.
    Transferred entries (meta "transfer"): how many per kind, candidates benchmarked of
    those generated, and the regret ``tunecache warm --exhaustive`` measured.

    Streams pages of rows and keeps only sums and the top keys, so memory stays flat;
    stops after ``max_rows`` rows (None: all) and says so in ``complete``. A row whose
    meta or timings do not validate, or hold the wrong types, is skipped.
    """
    total = _gain_row({})
    by_kind: dict[Any, dict[str, Any]] = {}
    by_op: dict[tuple[Any, Any], dict[str, Any]] = {}
    transferred: dict[Any, dict[str, Any]] = {}
    best_keys: list[tuple[float, str, dict[str, Any]]] = []
    read = 0
    complete = True
    for page in pages(db, lambda after: admin.select_gains_page(after, GAINS_PAGE)):
        if max_rows is not None and read + len(page) > max_rows:
            page = page[:max_rows - read]
            complete = False
        for row in page:
            meta, gain = _entry_gain(row)
            moved = meta.get("transfer")
            if isinstance(moved, dict):
                t = transferred.setdefault(row.kind, _transfer_row(row.kind))
                t["entries"] += 1
                for name in ("benchmarked", "generated"):
                    n = columns.integer(moved.get(name))
                    t[name] += n if n is not None and n >= 0 else 0
                regret = _ms(meta.get("regret"))
                if regret is not None:
                    t["regret_measured"] += 1
                    t["_sum"] += regret
                    t["regret_max"] = max(t["regret_max"] or regret, regret)
            if gain is None:
                continue
            kind_acc = by_kind.get(row.kind)
            if kind_acc is None:
                kind_acc = by_kind[row.kind] = _gain_row({"kind": row.kind})
            op_acc = by_op.get((row.kind, row.op))
            if op_acc is None:
                op_acc = by_op[row.kind, row.op] = _gain_row({"kind": row.kind, "op": row.op})
            for acc in (total, kind_acc, op_acc):
                acc["entries"] += 1
                for name in ("baseline_ms", "best_ms", "tune_seconds"):
                    acc[name] += gain[name]
            item = (gain["ms_saved_per_call"], gain["key_hash"], gain)
            if len(best_keys) < top:
                heapq.heappush(best_keys, item)
            elif item[:2] > best_keys[0][:2]:
                heapq.heapreplace(best_keys, item)
        read += len(page)
        if not complete:
            break
    for t in transferred.values():
        total_regret = t.pop("_sum")
        if t["regret_measured"]:
            t["regret_mean"] = total_regret / t["regret_measured"]

    def order(row: dict[str, Any]) -> tuple[float, str]:
        return (-row["ms_saved_per_call"], json.dumps([row.get("kind"), row.get("op")],
                                                      default=str))

    return {
        "rows_read": read,
        "complete": complete,
        "total": _finish_gain(total),
        "by_kind": sorted((_finish_gain(r) for r in by_kind.values()), key=order),
        "by_op": sorted((_finish_gain(r) for r in by_op.values()), key=order),
        "top_keys": [g for _, _, g in sorted(best_keys, key=lambda i: (-i[0], i[1]))],
        "transferred": sorted(transferred.values(),
                              key=lambda r: (-r["entries"], json.dumps(r["kind"], default=str))),
    }


def stats(db: Database, *, listed: int = 20,
          gains_rows: int | None = GAINS_ROWS) -> dict[str, Any]:
    """Everything `tunecache stats` reports, as one JSON-able dict."""
    groups = db.run(admin.stats_groups)
    by_state: dict[str, int] = {}
    by_env: dict[tuple[Any, ...], dict[str, Any]] = {}
    by_op: dict[tuple[Any, ...], dict[str, Any]] = {}
    by_kind: dict[tuple[Any, ...], dict[str, Any]] = {}
    hits = 0
    tune_seconds = 0.0
    saved = 0.0
    for g in groups:
        by_state[g.state] = by_state.get(g.state, 0) + g.entries
        hits += int(g.hits)
        saved += float(g.saved_seconds)
        if g.state == "done":
            tune_seconds += float(g.tune_seconds)
        for table, key, fields in (
            (by_env, (g.device, g.torch_version, g.triton_version),
             {"device": g.device, "torch": g.torch_version, "triton": g.triton_version}),
            (by_op, (g.kind, g.op), {"kind": g.kind, "op": g.op}),
            (by_kind, (g.kind,), {"kind": g.kind}),
        ):
            row = table.setdefault(key, {**fields, "entries": 0, "done": 0, "hits": 0,
                                         "tune_seconds": 0.0, "seconds_saved": 0.0})
            row["entries"] += g.entries
            row["hits"] += int(g.hits)
            row["seconds_saved"] += float(g.saved_seconds)
            if g.state == "done":
                row["done"] += g.entries
                row["tune_seconds"] += float(g.tune_seconds)
    usage = db.run(admin.usage_totals)
    live = db.run(lambda c: admin.live_claims(c, listed))
    expired = db.run(admin.expired_claims_count)
    failed = db.run(lambda c: admin.failed_keys(c, listed))
    revision = db.run(current_revision)

    def sort_key(row: dict[str, Any]) -> tuple[int, str]:
        return (-row["entries"], json.dumps([v for k, v in row.items() if isinstance(v, str)]))

    claimed = by_state.get("claimed", 0)
    bought = gains(db, max_rows=gains_rows)
    transferred = bought.pop("transferred")
    return {
        "database": db.display_url,
        "backend": db.dialect,
        "schema": revision,
        "size": database_size(db),
        "entries": {"total": sum(by_state.values()),
                    "by_state": {s: by_state.get(s, 0) for s in ("done", "claimed", "failed")}},
        "by_kind": sorted(by_kind.values(), key=sort_key),
        "by_environment": sorted(by_env.values(), key=sort_key),
        "by_op": sorted(by_op.values(), key=sort_key),
        "graphs": graph_stats(db),
        "gains": bought,
        "transferred": {"rows_read": bought["rows_read"], "complete": bought["complete"],
                        "by_kind": transferred},
        "hits": hits,
        "tune_seconds": tune_seconds,
        "seconds_saved": saved,
        "usage": {
            "reports": int(usage.reports),
            "hits": int(usage.hits),
            "tuned": int(usage.tuned),
            "peer": int(usage.peer),
            "local": int(usage.local),
            "seconds_saved": float(usage.seconds_saved),
            "seconds_tuning": float(usage.seconds_tuning),
            "first_at": usage.first,
            "last_at": usage.last,
        },
        "claims": {
            "in_flight": claimed - expired,
            "expired": expired,
            "live": [
                {"key_hash": r.key_hash, "op": r.op, "owner": r.owner, "token": r.token,
                 "attempts": r.attempts, "age_seconds": max(0.0, r.now - r.updated_at),
                 "expires_in_seconds": (r.lease_expires_at or r.now) - r.now}
                for r in live
            ],
        },
        "failed": {
            "count": by_state.get("failed", 0),
            "keys": [{"key_hash": r.key_hash, "op": r.op, "attempts": r.attempts,
                      "error": r.error} for r in failed],
        },
    }
