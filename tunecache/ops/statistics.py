"""What `tunecache stats` reports: entries by state, environment and op; size; hits; time
saved; claims in flight; failed keys. One JSON-able dict."""

from __future__ import annotations

import json
import os
from typing import Any

from ..store import ArtifactStore, Database, admin
from ..store.migrate import current_revision

__all__ = ["stats", "database_size", "graph_stats"]


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


def stats(db: Database, *, listed: int = 20) -> dict[str, Any]:
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
