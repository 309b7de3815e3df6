"""What `tunecache stats` reports: entries by state, environment and op; size; hits; time
saved; claims in flight; failed keys; what tuning bought and how transferred entries did.
One frozen :class:`StatsReport`, its parts reports of their own; the rows of its tables
are mappings, as --json prints them."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import heapq
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from .. import stored_json
from ..store import ArtifactStore, Database, columns, engine, stats_queries
from ..store import gains as gain_columns
from ..store.migrate import current_revision
from .entries import pages

__all__ = ["stats", "database_size", "graph_stats", "gains", "usage", "usage_by_day",
           "headline", "TOP_KEYS", "DAYS_SHOWN", "StatsReport", "EntryCounts", "UsageTotals",
           "Headline", "UsageDay", "ClaimsReport", "FailedKeys", "GraphStats",
           "GainsReport", "TransferredReport"]

# Rows per page of the entries whose gain columns no writer computed (read one by one).
GAINS_PAGE = 2000
TOP_KEYS = 10
# Days of the per-day view: the --since window's, at most this many (a year and a day).
DAYS_SHOWN = 366
# "All of it": a window no recorded time falls out of (stored times are at most 2^53).
_EVER = stored_json.MAX_NUMBER * 2

Row = Mapping[str, Any]  # a row of one of the report's tables


@dataclasses.dataclass(frozen=True)
class EntryCounts:
    total: int
    by_state: Mapping[str, int]  # done, claimed, failed


@dataclasses.dataclass(frozen=True)
class UsageTotals:
    """What the processes reported (tunecache_usage), pruned entries included; within
    ``since_seconds`` (None: all of it). ``invalid``: rows whose counts or times no
    tunecache writes, counted here and summed nowhere."""

    reports: int
    hits: int
    tuned: int
    peer: int
    local: int
    seconds_saved: float
    seconds_tuning: float
    first_at: float | None
    last_at: float | None
    invalid: int = 0
    since_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class Headline:
    """The three figures `stats` prints first. Compile time avoided: the tuning time of
    the results jobs took from the database (cache hits and peers' results) instead of
    tuning; tuning spent: what the jobs' own tuning took; and, over the stored entries
    with an untuned baseline, one call of each untuned against tuned. The first two are
    the processes' reports (within ``since_seconds``), the third the entries as stored."""

    compile_seconds_avoided: float
    results_served: int  # cache hits and peers' results
    tuning_seconds_spent: float
    keys_tuned: int  # tuned with and without the database
    entries_with_baseline: int
    untuned_ms_per_call: float
    tuned_ms_per_call: float
    ms_gained_per_call: float
    speedup: float | None
    since_seconds: float | None


@dataclasses.dataclass(frozen=True)
class UsageDay:
    """One UTC day of the processes' reports (``day``: YYYY-MM-DD)."""

    day: str
    reports: int
    hits: int
    peer: int
    tuned: int
    local: int
    seconds_saved: float
    seconds_tuning: float


@dataclasses.dataclass(frozen=True)
class ClaimsReport:
    in_flight: int
    expired: int
    live: tuple[Row, ...]


@dataclasses.dataclass(frozen=True)
class FailedKeys:
    count: int
    keys: tuple[Row, ...]


@dataclasses.dataclass(frozen=True)
class GraphStats:
    """Compiled graphs: count, payload bytes, rows whose size no tunecache writes
    (``invalid``: counted, summed nowhere) and loads by jobs, in all and by kind, torch
    version and both; on SQLite (``blob_dir``) what the blob directory holds."""

    count: int
    bytes: int
    invalid: int
    hits: int
    by_kind: tuple[Row, ...]
    by_torch: tuple[Row, ...]
    groups: tuple[Row, ...]
    blob_dir: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.blob_dir is None:
            del data["blob_dir"]
        return data


@dataclasses.dataclass(frozen=True)
class GainsReport:
    """What tuning bought: see :func:`gains`."""

    rows_parsed: int
    skipped: int
    total: Row
    by_kind: tuple[Row, ...]
    by_op: tuple[Row, ...]
    top_keys: tuple[Row, ...]


@dataclasses.dataclass(frozen=True)
class TransferredReport:
    by_kind: tuple[Row, ...]


@dataclasses.dataclass(frozen=True)
class StatsReport:
    database: str
    backend: str
    schema: str | None
    size: Mapping[str, Any]
    entries: EntryCounts
    by_kind: tuple[Row, ...]
    by_environment: tuple[Row, ...]
    by_op: tuple[Row, ...]
    graphs: GraphStats
    gains: GainsReport
    transferred: TransferredReport
    hits: int
    tune_seconds: float
    seconds_saved: float
    usage: UsageTotals
    claims: ClaimsReport
    failed: FailedKeys
    headline: Headline | None = None
    by_day: tuple[UsageDay, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        data = {**dataclasses.asdict(self), "graphs": self.graphs.to_json()}
        if self.by_day is None:
            del data["by_day"]
        return data


def database_size(db: Database) -> dict[str, Any]:
    """The database's size in bytes, and (SQLite) how many of them are free pages."""
    if db.is_sqlite:
        path = db.sqlite_path or ""
        pages, free, page_size = db.run(stats_queries.sqlite_size)
        return {
            "bytes": os.path.getsize(path) if os.path.exists(path) else pages * page_size,
            "free_bytes": int(free) * int(page_size),
        }
    return {"bytes": db.run(stats_queries.pg_database_size),
            "free_bytes": None}


def graph_stats(db: Database) -> GraphStats:
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
                                           "hits": 0, "loaded": 0})
            for field in ("count", "bytes", "invalid", "hits", "loaded"):
                row[field] += g[field]

    def order(row: Row) -> tuple[int, str]:
        return (-row["bytes"], json.dumps(row, sort_keys=True, default=str))

    return GraphStats(
        count=sum(g["count"] for g in groups),
        bytes=sum(g["bytes"] for g in groups),
        # Rows whose size no tunecache writes: counted here, summed nowhere; prune
        # --max-graph-bytes removes them first.
        invalid=sum(g["invalid"] for g in groups),
        hits=sum(g["hits"] for g in groups),  # loads by jobs
        by_kind=tuple(sorted(by_kind.values(), key=order)),
        by_torch=tuple(sorted(by_torch.values(), key=order)),
        groups=tuple(sorted(groups, key=order)),
        blob_dir=(None if store.blobs is None
                  else {"path": store.blobs.root, **store.blobs.usage()}))


def _gain_row(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {**fields, "entries": 0, "baseline_ms": 0.0, "best_ms": 0.0, "tune_seconds": 0.0}


def _speedup(baseline_ms: float, best_ms: float) -> float | None:
    """baseline / best, or None where that is no finite number (a denormal best time)."""
    ratio = baseline_ms / best_ms if best_ms > 0 else math.inf
    return ratio if math.isfinite(ratio) else None


def _finish_gain(row: dict[str, Any]) -> dict[str, Any]:
    row["speedup"] = _speedup(row["baseline_ms"], row["best_ms"])
    row["ms_saved_per_call"] = row["baseline_ms"] - row["best_ms"]
    return row


def _transfer_row(kind: Any) -> dict[str, Any]:
    return {"kind": kind, "entries": 0, "benchmarked": 0, "generated": 0,
            "regret_measured": 0, "regret_mean": None, "regret_max": None, "_sum": 0.0}


def _seconds(value: Any) -> float:
    seconds = columns.time(value)
    return seconds if seconds is not None and seconds >= 0 else 0.0


def _top_key(row: Any, gain: gain_columns.Gain) -> dict[str, Any]:
    assert gain.baseline_ms is not None and gain.best_ms is not None
    return {
        "key_hash": row.key_hash, "kind": row.kind, "op": row.op,
        "baseline_candidate": gain.candidate,
        "baseline_ms": gain.baseline_ms, "best_ms": gain.best_ms,
        "speedup": _speedup(gain.baseline_ms, gain.best_ms),
        "ms_saved_per_call": gain.baseline_ms - gain.best_ms,
        "tune_seconds": _seconds(row.tune_seconds),
        "hits": columns.integer(row.hits) or 0, "from": gain.source,
    }


class _Sums:
    """The sums of "what tuning bought" and "transferred", from the SQL aggregates of the
    gain columns and from rows read one by one."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.total = _gain_row({})
        self.by_kind: dict[Any, dict[str, Any]] = {}
        self.by_op: dict[tuple[Any, Any], dict[str, Any]] = {}
        self.transferred: dict[Any, dict[str, Any]] = {}
        self.best_keys: list[tuple[float, str, dict[str, Any]]] = []
        self.skipped = 0

    def add_gain(self, kind: Any, op: Any, entries: int, baseline_ms: float, best_ms: float,
                 tune_seconds: float) -> None:
        kind_acc = self.by_kind.get(kind)
        if kind_acc is None:
            kind_acc = self.by_kind[kind] = _gain_row({"kind": kind})
        op_acc = self.by_op.get((kind, op))
        if op_acc is None:
            op_acc = self.by_op[kind, op] = _gain_row({"kind": kind, "op": op})
        for acc in (self.total, kind_acc, op_acc):
            acc["entries"] += entries
            acc["baseline_ms"] += baseline_ms
            acc["best_ms"] += best_ms
            acc["tune_seconds"] += tune_seconds

    def add_transferred(self, kind: Any, entries: int, benchmarked: int, generated: int,
                        regret_measured: int, regret_sum: float,
                        regret_max: float | None) -> None:
        t = self.transferred.setdefault(kind, _transfer_row(kind))
        t["entries"] += entries
        t["benchmarked"] += benchmarked
        t["generated"] += generated
        t["regret_measured"] += regret_measured
        t["_sum"] += regret_sum
        if regret_max is not None:
            t["regret_max"] = max(t["regret_max"] or regret_max, regret_max)

    def add_top(self, key: dict[str, Any]) -> None:
        item = (key["ms_saved_per_call"], key["key_hash"], key)
        if len(self.best_keys) < self.top:
            heapq.heappush(self.best_keys, item)
        elif item[:2] > self.best_keys[0][:2]:
            heapq.heapreplace(self.best_keys, item)

    def add_row(self, row: Any) -> None:
        """One entry whose gain columns no writer computed, read from its texts."""
        gain = gain_columns.compute(row.kind, row.timings_json, row.meta_json)
        if not gain.readable:
            self.skipped += 1
            return
        if gain.generated is not None:
            self.add_transferred(row.kind, 1, gain.benchmarked or 0, gain.generated,
                                 int(gain.regret is not None), gain.regret or 0.0, gain.regret)
        if gain.baseline_ms is None or gain.best_ms is None:
            return
        self.add_gain(row.kind, row.op, 1, gain.baseline_ms, gain.best_ms,
                      _seconds(row.tune_seconds))
        self.add_top(_top_key(row, gain))


def _number(value: Any) -> float:
    """An SQL SUM of bounded values (PostgreSQL: a Decimal for integers; None: no rows)."""
    number = stored_json.number(float(value)) if value is not None else None
    return number if number is not None else 0.0


def gains(db: Database, *, top: int = TOP_KEYS) -> tuple[GainsReport, TransferredReport]:
    """What tuning bought and how transferred entries did, over every done entry.

    Per kind and per op: the entries with a baseline (the untuned choice's time), the
    sums of their baseline and best times (one call of each), the speedup and ms saved
    per call, and the tuning time that found them; the ``top`` keys by ms saved per call.
    Transferred entries (meta "transfer"): how many per kind, candidates benchmarked of
    those generated, and the regret ``tunecache warm --exhaustive`` measured.

    Sums the gain columns in SQL (tunecache.store.gains); the rows whose columns no
    writer computed are read and parsed here, in pages. A row whose meta or timings do
    not read is counted in ``skipped`` and summed nowhere.
    """
    sums = _Sums(top)
    for r in db.run(functools.partial(engine.rows, statement=stats_queries.GAINS_GROUPS)):
        if _number(r.entries):
            sums.add_gain(r.kind, r.op, int(_number(r.entries)), _number(r.baseline_ms),
                          _number(r.best_ms), _number(r.tune_seconds))
        if _number(r.transferred):
            sums.add_transferred(r.kind, int(_number(r.transferred)),
                                 int(_number(r.benchmarked)), int(_number(r.generated)),
                                 int(r.regret_measured), _number(r.regret_sum),
                                 stored_json.number(r.regret_max))
        sums.skipped += int(_number(r.skipped))
    for r in db.run(lambda c: stats_queries.top_gains(c, top)):
        baseline, best = columns.time(r.gain_baseline_ms), columns.time(r.gain_best_ms)
        if baseline is None or best is None:
            continue
        # The candidate's name is in the texts; the times are the columns stats summed.
        named = gain_columns.compute(r.kind, r.timings_json, r.meta_json)
        sums.add_top(_top_key(r, dataclasses.replace(named, baseline_ms=baseline,
                                                      best_ms=best)))
    read = 0
    for page in pages(db, lambda after: stats_queries.select_gains_page(after, GAINS_PAGE)):
        read += len(page)
        for row in page:
            sums.add_row(row)
    for t in sums.transferred.values():
        total_regret = t.pop("_sum")
        if t["regret_measured"]:
            t["regret_mean"] = total_regret / t["regret_measured"]

    def order(row: Row) -> tuple[float, str]:
        return (-row["ms_saved_per_call"], json.dumps([row.get("kind"), row.get("op")],
                                                      default=str))

    bought = GainsReport(
        rows_parsed=read,
        skipped=sums.skipped,
        total=_finish_gain(sums.total),
        by_kind=tuple(sorted((_finish_gain(r) for r in sums.by_kind.values()), key=order)),
        by_op=tuple(sorted((_finish_gain(r) for r in sums.by_op.values()), key=order)),
        top_keys=tuple(g for _, _, g in sorted(sums.best_keys, key=lambda i: (-i[0], i[1]))))
    return bought, TransferredReport(tuple(sorted(
        sums.transferred.values(),
        key=lambda r: (-r["entries"], json.dumps(r["kind"], default=str)))))


def _int(value: Any) -> int:
    return int(_number(value))


def usage(db: Database, since: float | None = None) -> UsageTotals:
    """The processes' reports of the last ``since`` seconds (None: all), summed within
    bounds (tunecache.store.stats_queries: a row out of them is counted in ``invalid``)."""
    u, invalid = db.run(lambda c: stats_queries.usage_totals(c, _EVER if since is None
                                                             else since))
    return UsageTotals(
        reports=_int(u.reports), hits=_int(u.hits), tuned=_int(u.tuned), peer=_int(u.peer),
        local=_int(u.local), seconds_saved=_number(u.seconds_saved),
        seconds_tuning=_number(u.seconds_tuning), first_at=columns.time(u.first),
        last_at=columns.time(u.last), invalid=invalid, since_seconds=since)


def usage_by_day(db: Database, since: float | None = None,
                 days: int = DAYS_SHOWN) -> tuple[UsageDay, ...]:
    """The processes' reports per UTC day, newest first: the days of the last ``since``
    seconds (None: all), at most ``days`` of them."""
    rows = db.run(lambda c: stats_queries.usage_by_day(
        c, _EVER if since is None else since, days))
    return tuple(UsageDay(
        day=datetime.datetime.fromtimestamp(_int(r.day) * 86400,
                                            datetime.timezone.utc).strftime("%Y-%m-%d"),
        reports=_int(r.reports), hits=_int(r.hits), peer=_int(r.peer), tuned=_int(r.tuned),
        local=_int(r.local), seconds_saved=_number(r.seconds_saved),
        seconds_tuning=_number(r.seconds_tuning)) for r in rows)


def headline(used: UsageTotals, bought: GainsReport) -> Headline:
    total = bought.total
    return Headline(
        compile_seconds_avoided=used.seconds_saved,
        results_served=used.hits + used.peer,
        tuning_seconds_spent=used.seconds_tuning,
        keys_tuned=used.tuned + used.local,
        entries_with_baseline=total["entries"],
        untuned_ms_per_call=total["baseline_ms"],
        tuned_ms_per_call=total["best_ms"],
        ms_gained_per_call=total["ms_saved_per_call"],
        speedup=total["speedup"],
        since_seconds=used.since_seconds)


def stats(db: Database, *, listed: int = 20, since: float | None = None,
          by_day: bool = False) -> StatsReport:
    """Everything `tunecache stats` reports; the processes' reports (usage, headline,
    per day) of the last ``since`` seconds only, where given."""
    groups = db.run(stats_queries.stats_groups)
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
    used = usage(db, since)
    live = db.run(lambda c: stats_queries.live_claims(c, listed))
    expired = db.run(stats_queries.expired_claims_count)
    failed = db.run(lambda c: stats_queries.failed_keys(c, listed))
    revision = db.run(current_revision)

    def sort_key(row: Row) -> tuple[int, str]:
        return (-row["entries"], json.dumps([v for k, v in row.items() if isinstance(v, str)]))

    claimed = by_state.get("claimed", 0)
    bought, transferred = gains(db)
    return StatsReport(
        database=db.display_url,
        backend=db.dialect,
        schema=revision,
        size=database_size(db),
        entries=EntryCounts(sum(by_state.values()),
                            {s: by_state.get(s, 0) for s in ("done", "claimed", "failed")}),
        by_kind=tuple(sorted(by_kind.values(), key=sort_key)),
        by_environment=tuple(sorted(by_env.values(), key=sort_key)),
        by_op=tuple(sorted(by_op.values(), key=sort_key)),
        graphs=graph_stats(db),
        gains=bought,
        transferred=transferred,
        hits=hits,
        tune_seconds=tune_seconds,
        seconds_saved=saved,
        usage=used,
        claims=ClaimsReport(
            in_flight=claimed - expired,
            expired=expired,
            live=tuple(
                {"key_hash": r.key_hash, "op": r.op, "owner": r.owner, "token": r.token,
                 "attempts": r.attempts, "age_seconds": max(0.0, r.now - r.updated_at),
                 "expires_in_seconds": (r.lease_expires_at or r.now) - r.now}
                for r in live
            ),
        ),
        failed=FailedKeys(
            count=by_state.get("failed", 0),
            keys=tuple({"key_hash": r.key_hash, "op": r.op, "attempts": r.attempts,
                        "error": r.error} for r in failed),
        ),
        headline=headline(used, bought),
        by_day=usage_by_day(db, since) if by_day else None,
    )
