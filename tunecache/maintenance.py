"""What the operators of a shared cache run: stats, prune, export/import/merge, ls, show.

Library functions behind ``tunecache`` subcommands (:mod:`tunecache.cli` only formats).
They are safe while jobs run:

- every transaction is short: a page of a listing, a batch of a prune or an import;
  nothing holds the SQLite write lock for longer than one batch (a fraction of a second),
  and a prune pauses between batches so that waiting lookups and claims get in;
- a claim whose lease has not passed is never deleted or overwritten;
- a deleted ``done`` entry is simply tuned again by the next job that needs it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import socket
import time
from contextlib import nullcontext
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, TextIO

from sqlalchemy import Connection

from . import __version__
from .errors import ConfigError, InvalidEntryError, StoreUnavailableError, TuneCacheError
from .keys import (
    MAX_KEY_BYTES,
    best_candidate,
    key_hash,
    key_labels,
    timings_to_json,
    validate_timings,
)
from .settings import Settings
from .store import Database, ensure_schema
from .store import admin
from .store.migrate import current_revision

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "CONFLICT_POLICIES",
    "ExportFormatError",
    "EntryNotFoundError",
    "ReadonlyModeError",
    "open_database",
    "parse_duration",
    "stats",
    "PruneSpec",
    "prune",
    "export",
    "parse_export",
    "import_records",
    "merge",
    "ls",
    "show",
    "upgrade",
]

logger = logging.getLogger("tunecache")

EXPORT_FORMAT = "tunecache-export"
EXPORT_VERSION = 1
CONFLICT_POLICIES = ("keep", "replace", "faster")
ConflictPolicy = Literal["keep", "replace", "faster"]
Progress = Callable[[int], None]

# Rows per delete transaction. PostgreSQL blocks nobody with a delete, and its cost per
# row does not fall with the batch (1M entries, half pruned: 29-33 s at 2000, 39 s at
# 5000), so small fixed transactions there. On SQLite a batch holds the write lock (jobs'
# claims wait for it, and lookups during its commit), while the cost per row falls with
# the batch: the key-hash and stats indexes are random with respect to the rowid walk,
# so a batch dirties (journals, writes, fsyncs) a share of all their pages whatever its
# size. Measured on 1M entries of 3.5 KB, half pruned, no traffic: 40 s at 5000 rows
# (390 ms each), 32 s at 10000, 25 s at 20000 (1 s each); 40000 is no cheaper per row.
# So SQLite's batches are sized by time: the first has PRUNE_BATCH rows, each next one
# as many as the last one's pace says fit in PRUNE_BATCH_SECONDS of lock (at most twice
# the last). That is ~20000 rows on a local disk, and fewer where fsync is slow (network
# filesystems), so a waiting claim never waits much longer than that, whatever the disk.
PRUNE_BATCH = {"sqlite": 5000, "postgresql": 2000}
PRUNE_BATCH_SECONDS = 1.0
PRUNE_BATCH_MIN, PRUNE_BATCH_MAX = 500, 50_000
PRUNE_PAUSE = 0.1  # seconds between two SQLite batches; see _yield_lock
IMPORT_BATCH = 500  # also bounded by SQLite's bound-parameter limit (999 before 3.32)
PAGE = 1000
# VACUUM (SQLite) after a prune once free pages are this share of the file; see prune().
VACUUM_FREE_SHARE = 0.25
# ... and only on files up to this size: VACUUM copies the surviving entries at about
# 100 MB/s (measured: 1.75 GB kept of 3.5 GB in 33 s) while holding the write lock, so
# past this a running job's claim would wait longer than its lock timeout (30 s default)
# and fall back to tuning locally.
VACUUM_AUTO_MAX_BYTES = 256 * 2**20


def _noop(_n: int) -> None:
    pass


# What a deeply nested JSON text gets: json's C scanner recurses once per level and raises
# RecursionError, not ValueError (a 200 KB '[[[...]]]' line, under every size limit, took
# `tunecache import` down with a traceback). Everything here that parses JSON from a file
# or a column goes through these two, so such a text is one more invalid entry.
_TOO_DEEP = "nested too deeply"


def _loads(text: str | bytes) -> Any:
    """json.loads, with a RecursionError turned into the ValueError of any other bad JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None


def _timings(raw: Any, key_hash_: str) -> dict[str, float]:
    """validate_timings, with a RecursionError turned into InvalidEntryError."""
    try:
        return validate_timings(raw, key_hash_)
    except RecursionError:
        raise InvalidEntryError(key_hash_, f"timings are {_TOO_DEEP}") from None


def _stored_key(key_json: Any) -> dict[str, Any]:
    """A stored key column, parsed; ValueError(reason) when it is not a key."""
    if not isinstance(key_json, str):
        raise ValueError("key is not text")
    if len(key_json) > MAX_KEY_BYTES:
        raise ValueError(f"key larger than {MAX_KEY_BYTES} bytes")
    try:
        key = _loads(key_json)
    except ValueError as e:
        raise ValueError(f"key is not valid JSON ({e})") from None
    if not isinstance(key, dict):
        raise ValueError("key is not a JSON object")
    return key


class ExportFormatError(TuneCacheError):
    """An import file is not a tunecache export this tunecache can read."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(source, reason)
        self.source = source
        self.reason = reason

    def __str__(self) -> str:
        return (
            f"{self.source}: {self.reason}; expected a file written by `tunecache export` "
            f"(first line {{\"format\": \"{EXPORT_FORMAT}\", \"version\": {EXPORT_VERSION}, ...}})"
        )


class EntryNotFoundError(TuneCacheError):
    """No entry, or more than one, matches a key hash prefix."""

    def __init__(self, prefix: str, reason: str) -> None:
        super().__init__(prefix, reason)
        self.prefix = prefix
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.prefix}: {self.reason}"


class ReadonlyModeError(TuneCacheError):
    """A command that writes, asked of a process in readonly mode (TUNECACHE_MODE)."""

    def __init__(self, url: str, action: str) -> None:
        super().__init__(url, action)
        self.url = url
        self.action = action

    def __str__(self) -> str:
        return (f"tunecache database {self.url}: {self.action} writes to the database, and "
                "TUNECACHE_MODE=readonly forbids writes; run it with TUNECACHE_MODE=readwrite")


# -- opening -----------------------------------------------------------------------------


def open_database(settings: Settings, *, create: bool = False,
                  writes: str | None = None) -> Database:
    """A :class:`Database` at the head schema (migrating when the mode allows it).

    ``create=False`` refuses a SQLite path that does not exist, instead of creating an
    empty database there, because a typo in --db would otherwise report an empty cache.
    ``create=True`` creates the file, but never its directory: a mistyped directory
    would otherwise be created and filled silently (and `stats` on the intended path
    would then find nothing).

    In readonly mode the connection itself refuses writes, as a job's does; ``writes``
    names what the caller is about to write, refused up front in one line.
    """
    readonly = settings.mode == "readonly"
    db = Database(settings.db_url, settings.lock_timeout, readonly=readonly)
    if writes and readonly:
        raise ReadonlyModeError(db.display_url, writes)
    path = db.sqlite_path
    if path and not os.path.exists(path):
        directory = os.path.dirname(path) or "."
        if not create:
            raise StoreUnavailableError(
                db.display_url,
                "no database file there (nothing recorded yet?); check --db or TUNECACHE_DB",
            )
        if not os.path.isdir(directory):
            raise StoreUnavailableError(
                db.display_url,
                f"directory {directory} does not exist; check --db, or create it first",
            )
    ensure_schema(db, may_migrate=settings.mode == "readwrite")
    return db


def _refuse_readonly(db: Database, action: str) -> None:
    if db.readonly:
        raise ReadonlyModeError(db.display_url, action)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION_HELP = "3600s, 90m, 12h, 30d or 2w"


def parse_duration(text: str, name: str = "--older-than") -> float:
    """'90s', '15m', '12h', '30d', '2w' -> seconds.

    The unit is required: a bare '30' meant 30 seconds, which an operator who meant 30
    days only finds out when every entry is gone.
    """
    match = _DURATION.match(text or "")
    if not match:
        raise ConfigError(name, text, f"a duration with a unit (s, m, h, d or w), such as "
                          f"{DURATION_HELP}")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


# -- stats -------------------------------------------------------------------------------


def _size(db: Database) -> dict[str, Any]:
    if db.is_sqlite:
        path = db.sqlite_path or ""
        pages = db.run(lambda c: c.execute(admin.SQLITE_PAGE_COUNT).scalar_one())
        free = db.run(lambda c: c.execute(admin.SQLITE_FREELIST_COUNT).scalar_one())
        page_size = db.run(lambda c: c.execute(admin.SQLITE_PAGE_SIZE).scalar_one())
        return {
            "bytes": os.path.getsize(path) if os.path.exists(path) else pages * page_size,
            "free_bytes": int(free) * int(page_size),
        }
    return {"bytes": int(db.run(lambda c: c.execute(admin.PG_DATABASE_SIZE).scalar_one())),
            "free_bytes": None}


def stats(db: Database, *, listed: int = 20) -> dict[str, Any]:
    """Everything `tunecache stats` reports, as one JSON-able dict."""
    groups = db.run(lambda c: c.execute(admin.STATS_GROUPS).all())
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
    usage = db.run(lambda c: c.execute(admin.USAGE_TOTALS).one())
    live = db.run(lambda c: c.execute(admin.CLAIMS_LIVE, {"p_limit": listed}).all())
    expired = int(db.run(lambda c: c.execute(admin.CLAIMS_EXPIRED_COUNT).scalar_one()))
    failed = db.run(lambda c: c.execute(admin.FAILED_KEYS, {"p_limit": listed}).all())
    revision = db.run(current_revision)

    def sort_key(row: dict[str, Any]) -> tuple[int, str]:
        return (-row["entries"], json.dumps([v for k, v in row.items() if isinstance(v, str)]))

    claimed = by_state.get("claimed", 0)
    return {
        "database": db.display_url,
        "backend": db.dialect,
        "schema": revision,
        "size": _size(db),
        "entries": {"total": sum(by_state.values()),
                    "by_state": {s: by_state.get(s, 0) for s in ("done", "claimed", "failed")}},
        "by_kind": sorted(by_kind.values(), key=sort_key),
        "by_environment": sorted(by_env.values(), key=sort_key),
        "by_op": sorted(by_op.values(), key=sort_key),
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


# -- prune -------------------------------------------------------------------------------


@dataclasses.dataclass
class PruneSpec:
    """What to prune; the classes are OR-ed, the entry filters within a class AND-ed."""

    older_than: float | None = None
    keep: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    only: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    ops: list[str] = dataclasses.field(default_factory=list)
    kinds: list[str] = dataclasses.field(default_factory=list)
    failed: bool = False
    expired_claims: bool = False
    invalid: bool = False

    @property
    def env(self) -> admin.EntryFilter:
        return admin.EntryFilter(keep=self.keep, only=self.only, ops=self.ops, kinds=self.kinds)

    def is_empty(self) -> bool:
        return not (self.older_than is not None or self.env or self.failed
                    or self.expired_claims or self.invalid)


def _listing(row: Any) -> dict[str, Any]:
    return {
        "key_hash": row.key_hash, "state": row.state, "kind": row.kind, "op": row.op,
        "device": row.device, "torch": row.torch_version, "triton": row.triton_version,
        "hits": row.hits, "best": row.best, "tune_seconds": row.tune_seconds,
        "owner": row.owner, "created_at": row.created_at, "updated_at": row.updated_at,
        "last_used_at": row.last_used_at,
    }


_LISTING_KEYS = ("key_hash", "state", "kind", "op", "device", "torch", "triton", "hits", "best",
                 "tune_seconds", "owner", "created_at", "updated_at", "last_used_at")


def _invalid_hashes(db: Database) -> Iterator[tuple[str, str]]:
    """(key_hash, reason) of done entries whose key or timings fail validation, page by
    page (the reasons `export` and `merge` skip them for)."""
    after = ""
    while True:
        page = db.run(lambda c: c.execute(admin.select_done_timings_page(after, PAGE)).all())
        if not page:
            return
        for row in page:
            try:
                _stored_key(row.key_json)
                _timings(row.timings_json, row.key_hash)
            except InvalidEntryError as e:
                yield row.key_hash, e.reason
            except ValueError as e:
                yield row.key_hash, str(e)
        after = page[-1].key_hash


def prune(
    db: Database,
    spec: PruneSpec,
    *,
    dry_run: bool = False,
    vacuum: Literal["auto", "always", "never"] = "auto",
    batch: int | None = None,
    pause: bool = True,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Delete (or, dry run, list) what ``spec`` selects; see :class:`PruneSpec`.

    ``batch`` fixes the rows per transaction; by default SQLite's batches are sized to
    hold the write lock about PRUNE_BATCH_SECONDS each. ``pause=False`` deletes batch
    after batch with no pause (SQLite): 0.1 s a batch faster, for a maintenance window;
    running jobs would wait for the whole prune.

    SQLite does not give deleted pages back to the filesystem; it reuses them for new
    entries. ``vacuum="auto"`` runs VACUUM only when the free pages reach a quarter of the
    file (below that the next jobs reuse the space anyway) and the file is at most 256
    MiB: VACUUM rewrites the whole file while holding the write lock (claims wait for it,
    lookups too during its final copy), a few seconds at that size, minutes for a
    multi-GB cache, which is then left to ``vacuum="always"`` in a quiet hour. On PostgreSQL it
    runs a plain VACUUM of the table (no exclusive lock; space is reused, files do not
    shrink; VACUUM FULL would lock every reader out).
    """
    progress = progress or _noop
    if spec.is_empty():
        raise ConfigError(
            "prune", "(no selection)",
            "at least one of --older-than, --keep-*/--torch/--triton/--device/--op, "
            "--failed, --expired-claims, --invalid",
        )
    if not dry_run:
        _refuse_readonly(db, "prune")
    started = time.perf_counter()
    condition = admin.prune_condition(
        older_than=spec.older_than, env=spec.env if spec.env else None,
        failed=spec.failed, expired_claims=spec.expired_claims,
    )
    size_before = _size(db)
    report: dict[str, Any] = {"database": db.display_url, "dry_run": dry_run}
    invalid = list(_invalid_hashes(db)) if spec.invalid else []
    if dry_run:
        return _prune_listing(db, condition, invalid, report, started, progress, on_total)

    # No count first: on SQLite that is a scan of the whole file (6 s for a million
    # entries), so the progress bar follows the walk's position instead (per mille).
    if on_total:
        on_total(1000)
    deleted = 0
    batches = 0
    walk = admin.prune_walk_column(db.dialect)
    delete_range = admin.delete_pruned_range(condition, walk)
    size = batch or PRUNE_BATCH[db.dialect]
    timed = batch is None and db.is_sqlite
    largest = 0
    selects_rows = spec.older_than is not None or bool(spec.env) or spec.failed \
        or spec.expired_claims
    top = db.run(lambda c: c.execute(admin.select_walk_end(walk)).scalar()) \
        if selects_rows else None
    after: Any = 0 if db.is_sqlite else ""
    shown = 0
    while top is not None:
        def one_batch(conn: Connection) -> tuple[Any, int, int, float]:
            locked = time.perf_counter()  # the write lock is ours from here (SQLite)
            with admin.sqlite_prune_pragmas(conn) if db.is_sqlite else nullcontext():
                select_batch = admin.select_prune_batch(condition, size, walk)
                ends = conn.execute(select_batch, {"p_after": after, "p_top": top}).scalars().all()
                if not ends:
                    return None, 0, 0, locked
                result = conn.execute(delete_range, {"p_after": after, "p_last": ends[-1]})
                return ends[-1], result.rowcount, len(ends), locked

        last, n, selected, locked = db.run(one_batch, write=True)
        held = time.perf_counter() - locked  # until the commit is done
        if last is None:
            break
        after = last
        deleted += n
        batches += 1
        largest = max(largest, selected)
        where = _walk_permille(after, top)
        progress(where - shown)
        shown = where
        if timed and selected == size:
            size = _next_batch_size(size, held)
        if pause:
            _yield_lock(db)
    progress(1000 - shown)
    # Invalid entries (done ones only; the condition pass may have taken some already).
    for i in range(0, len(invalid), IMPORT_BATCH):
        chunk = [h for h, _ in invalid[i:i + IMPORT_BATCH]]
        n = db.run(lambda c: c.execute(admin.delete_invalid, {"p_hashes": chunk}).rowcount,
                   write=True)
        deleted += n
        batches += 1
    report.update(deleted=deleted, batches=batches, largest_batch=largest, invalid=len(invalid))
    report["vacuum"] = _vacuum(db, vacuum, deleted)
    report["size_before"] = size_before
    report["size_after"] = _size(db)
    report["seconds"] = time.perf_counter() - started
    return report


def _next_batch_size(size: int, held: float) -> int:
    """SQLite: the rows the next batch may take to hold the lock ~PRUNE_BATCH_SECONDS,
    from the last batch's ``size`` rows in ``held`` seconds. It at most doubles, since the
    cost per row falls with the batch (the pace of a small one overestimates a big one)."""
    fits = int(size * PRUNE_BATCH_SECONDS / max(held, 1e-3))
    return max(PRUNE_BATCH_MIN, min(PRUNE_BATCH_MAX, 2 * size, fits))


def _yield_lock(db: Database) -> None:
    """Between two delete batches on SQLite, leave the lock free long enough for waiters.

    A rollback-journal writer blocks every reader while it commits, and back-to-back
    batches starve the lookups and claims of running jobs for the whole prune (measured:
    5 lookups got through a 1 s prune). A waiter here retries at least every ~50 ms
    (SQLite's busy handler gives up after _SQLITE_BUSY_SECONDS, trying at 33 and 50 ms;
    Database.run then sleeps at most 30 ms), so a pause of PRUNE_PAUSE (0.1 s) lets every
    waiter's next try land in it, and claims (a few ms each) through. It no longer grows
    with the batch (it was 0.12 s + a quarter of the batch, for SQLite's own 100 ms
    backoff): batches are sized to ~1 s, so a waiting claim waits about one batch either
    way (1M entries: claim+publish p99 1.09 s), and the longer pause cost 2.5 s of a 33 s
    prune. PostgreSQL readers never wait for a delete (MVCC) and writers only for the
    rows deleted: no pause there.
    """
    if db.is_sqlite:
        time.sleep(PRUNE_PAUSE)


def _walk_permille(position: Any, top: Any) -> int:
    """How far (0-1000) a walk at ``position`` is through an order that ends at ``top``."""
    if isinstance(position, int):
        return min(1000, position * 1000 // max(int(top), 1))
    # Key hashes are uniform hex: their first 8 digits say how far through we are.
    return min(1000, int(str(position)[:8].ljust(8, "0"), 16) * 1000 // 0xFFFFFFFF)


def _prune_listing(
    db: Database,
    condition: Any,
    invalid: list[tuple[str, str]],
    report: dict[str, Any],
    started: float,
    progress: Callable[[int], None],
    on_total: Callable[[int], None] | None,
) -> dict[str, Any]:
    """--dry-run: every entry a prune would delete, in key order."""
    matched = int(db.run(lambda c: c.execute(admin.count_pruned(condition)).scalar_one()))
    if on_total:
        on_total(matched + len(invalid))
    rows: list[dict[str, Any]] = []
    after = ""
    while matched:
        page = db.run(lambda c: c.execute(admin.select_pruned(condition, after, PAGE)).all())
        if not page:
            break
        rows.extend(_listing(r) for r in page)
        after = page[-1].key_hash
        progress(len(page))
    reasons = dict(invalid)
    listed = set()
    for row in rows:
        listed.add(row["key_hash"])
        if row["key_hash"] in reasons:
            row["invalid"] = reasons[row["key_hash"]]
    for h, reason in invalid:
        if h in listed:
            continue
        got = show(db, h)
        rows.append({**{k: got[k] for k in _LISTING_KEYS}, "invalid": reason})
        progress(1)
    report.update(would_delete=len(rows), entries=rows, seconds=time.perf_counter() - started)
    return report


def _vacuum(db: Database, mode: str, deleted: int) -> dict[str, Any]:
    if mode == "never" or (mode == "auto" and not deleted):
        return {"ran": False, "why": "not asked" if mode == "never" else "nothing deleted"}
    if db.is_sqlite:
        size = _size(db)
        share = size["free_bytes"] / size["bytes"] if size["bytes"] else 0.0
        if mode == "auto" and share < VACUUM_FREE_SHARE:
            return {"ran": False, "why": f"free pages are {share:.0%} of the file "
                    f"(under {VACUUM_FREE_SHARE:.0%}); SQLite reuses them for new entries"}
        if mode == "auto" and size["bytes"] > VACUUM_AUTO_MAX_BYTES:
            return {"ran": False, "why": f"free pages are {share:.0%} of the file, but "
                    f"VACUUM of {size['bytes'] / 2**20:.0f} MiB would hold the lock for "
                    "tens of seconds; run `tunecache prune --vacuum ...` when no job runs"}
        why = "asked" if mode == "always" else f"free pages were {share:.0%} of the file"
        statement = admin.SQLITE_VACUUM
    else:
        why = "asked" if mode == "always" else "rows deleted; plain VACUUM makes space reusable"
        statement = admin.PG_VACUUM_ENTRIES
    started = time.perf_counter()
    # VACUUM cannot run inside a transaction: a "read" run is autocommit on both engines.
    db.run(lambda c: c.execute(statement))
    return {"ran": True, "why": why, "seconds": time.perf_counter() - started}


# -- export ------------------------------------------------------------------------------


def _json_safe_timings(timings: Mapping[str, float]) -> dict[str, float | None]:
    return {k: (None if v == math.inf else v) for k, v in sorted(timings.items())}


def export(
    db: Database,
    out: TextIO,
    *,
    best_only: bool = False,
    env: admin.EntryFilter | None = None,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Write done entries as JSON lines: a header, then one entry per line.

    ``best_only`` keeps the winning candidate's timing and writes every other candidate
    as null ("not measured"): the file is smaller, a consumer still picks the same winner,
    and Inductor, which needs a timing for every choice, gets a full hit (unmeasured
    candidates count as infinitely slow) instead of benchmarking the missing ones.
    """
    progress = progress or _noop
    total = int(db.run(lambda c: c.execute(admin.count_done(env)).scalar_one()))
    if on_total:
        on_total(total)
    header = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "tunecache": __version__,
        "exported_at": time.time(),
        "source": db.display_url,
        "best_only": best_only,
        "entries": total,
    }
    out.write(json.dumps(header, sort_keys=True) + "\n")
    written = 0
    skipped: list[dict[str, str]] = []
    after = ""
    while True:
        page = db.run(lambda c: c.execute(admin.select_done_page(env, after, PAGE)).all())
        if not page:
            break
        for row in page:
            try:
                timings = _timings(row.timings_json, row.key_hash)
                key = _stored_key(row.key_json)
            except (InvalidEntryError, ValueError) as e:
                # A bad row is left behind (and reported), never shipped to other clusters.
                skipped.append({"key_hash": row.key_hash,
                                "reason": getattr(e, "reason", None) or str(e)})
                continue
            best = best_candidate(timings)
            if best_only:
                timings = {name: (ms if name == best else math.inf)
                           for name, ms in timings.items()}
            line = {
                "key": key,
                "key_hash": row.key_hash,
                "timings": _json_safe_timings(timings),
                "best": best,
                "tune_seconds": row.tune_seconds,
                "created_at": row.created_at,
                "updated_at": row.updated_at,
            }
            out.write(json.dumps(line, sort_keys=True, separators=(",", ":"),
                                 allow_nan=False) + "\n")
            written += 1
        after = page[-1].key_hash
        progress(len(page))
    return {"database": db.display_url, "exported": written, "skipped_invalid": skipped,
            "best_only": best_only}


# -- import / merge ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Incoming:
    where: str
    key_hash: str
    key_json: str
    labels: dict[str, str | None]
    timings: dict[str, float]
    timings_json: str
    best: str
    tune_seconds: float | None


def _validated(where: str, record: Any) -> _Incoming:
    """Check one imported entry; raise ValueError(reason). Nothing supplied is trusted:
    the hash is recomputed from the key, the winner from the timings."""
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    key = record.get("key")
    if not isinstance(key, dict):
        raise ValueError('"key" is missing or not a JSON object')
    try:
        h, key_json = key_hash(key)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad key: {e}") from None
    except RecursionError:
        raise ValueError(f"bad key: {_TOO_DEEP}") from None
    supplied = record.get("key_hash")
    if supplied is not None and supplied != h:
        raise ValueError(f'"key_hash" does not match the key (the key hashes to {h[:16]})')
    if "timings" not in record:
        raise ValueError('"timings" is missing')
    try:
        timings = _timings(record["timings"], h)
    except InvalidEntryError as e:
        raise ValueError(e.reason) from None
    tune_seconds = record.get("tune_seconds")
    if tune_seconds is not None and (
        isinstance(tune_seconds, bool) or not isinstance(tune_seconds, (int, float))
        or not math.isfinite(tune_seconds) or tune_seconds < 0
    ):
        raise ValueError(f'"tune_seconds" is {tune_seconds!r}, not a non-negative number')
    # All-null timings are a result too ("no candidate runs here"); stored with an empty
    # winner, as the coordinator publishes them.
    best = best_candidate(timings) or ""
    return _Incoming(where, h, key_json, key_labels(key), timings, timings_to_json(timings),
                     best, None if tune_seconds is None else float(tune_seconds))


def parse_export(lines: Iterable[str], source: str = "input") -> Iterator[tuple[str, Any]]:
    """(where, record or ValueError) for each entry line of an export file.

    The header must come first; a file that does not start with one is refused whole
    (:class:`ExportFormatError`), a bad entry line only costs that line.
    """
    it = iter(lines)
    number = 0
    header: Any = None
    for raw in it:
        number += 1
        if raw.strip():
            try:
                header = _loads(raw)
            except ValueError:
                header = None
            break
    if not isinstance(header, dict) or header.get("format") != EXPORT_FORMAT:
        raise ExportFormatError(source, f"line {number} is not a tunecache export header")
    if header.get("version") != EXPORT_VERSION:
        raise ExportFormatError(
            source, f"export format version {header.get('version')!r} is not supported "
            f"(this tunecache reads version {EXPORT_VERSION}; upgrade tunecache)")
    for raw in it:
        number += 1
        if not raw.strip():
            continue
        if len(raw) > MAX_KEY_BYTES + 2 * 1024 * 1024:
            yield f"line {number}", ValueError("line too long")
            continue
        try:
            record = _loads(raw)
        except json.JSONDecodeError as e:
            record = ValueError(f"not JSON ({e.msg} at column {e.colno})")
        except ValueError as e:
            record = ValueError(f"not JSON ({e})")
        yield f"line {number}", record


def _fastest(timings: Mapping[str, float]) -> float:
    return min((ms for ms in timings.values() if math.isfinite(ms)), default=math.inf)


def import_records(
    db: Database,
    records: Iterable[tuple[str, Any]],
    *,
    on_conflict: ConflictPolicy = "keep",
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Validate and write entries; see :data:`CONFLICT_POLICIES` and the CLI's help.

    For a key already in the target:

    - done: ``keep`` leaves it as it is (a done entry is immutable); ``replace`` overwrites
      it; ``faster`` overwrites it only if the incoming fastest timing is lower;
    - claimed and its lease running: left alone under every policy (someone is tuning it;
      reported as busy);
    - failed, or a claim whose lease has passed: replaced by the done entry under every
      policy (a result beats no result; the old owner's late publish is fenced out).
    """
    if on_conflict not in CONFLICT_POLICIES:
        raise ConfigError("--on-conflict", on_conflict, " or ".join(CONFLICT_POLICIES))
    if not dry_run:
        _refuse_readonly(db, "import")
    progress = progress or _noop
    owner = f"import:{socket.gethostname()[:200]}:{os.getpid()}"
    insert_done = admin.insert_done(db.dialect, owner)
    counts = {"inserted": 0, "replaced": 0, "unchanged": 0, "busy": 0}
    bad: list[dict[str, str]] = []
    seen: set[str] = set()

    def flush(batch: list[_Incoming]) -> None:
        def work(conn: Connection) -> dict[str, int]:
            got = {"inserted": 0, "replaced": 0, "unchanged": 0, "busy": 0}
            existing = {r.key_hash: r for r in conn.execute(
                admin.read_for_import, {"p_hashes": [i.key_hash for i in batch]})}
            inserts: list[dict[str, Any]] = []
            overwrites: list[dict[str, Any]] = []
            for inc in batch:
                params = {"p_key_hash": inc.key_hash, "p_timings_json": inc.timings_json,
                          "p_best": inc.best, "p_tune_seconds": inc.tune_seconds}
                row = existing.get(inc.key_hash)
                if row is None:
                    inserts.append({**params, "p_key_json": inc.key_json,
                                    **{f"p_{k}": v for k, v in inc.labels.items()}})
                    continue
                if row.state == "claimed" and (row.lease_expires_at or 0.0) > row.now:
                    got["busy"] += 1
                    continue
                if row.state == "done":
                    if on_conflict == "keep" or row.timings_json == inc.timings_json:
                        got["unchanged"] += 1
                        continue
                    if on_conflict == "faster":
                        try:
                            old = _fastest(_timings(row.timings_json, row.key_hash))
                        except InvalidEntryError:
                            old = math.inf  # an invalid stored entry loses to any result
                        if not _fastest(inc.timings) < old:
                            got["unchanged"] += 1
                            continue
                overwrites.append({**params, "p_token": row.token, "p_state": row.state,
                                   "p_owner": owner})
            if dry_run:
                got["inserted"] += len(inserts)
                got["replaced"] += len(overwrites)
                return got
            if inserts:
                done = conn.execute(insert_done, inserts).all()
                got["inserted"] += len(done)
                got["busy"] += len(inserts) - len(done)  # claimed by a job meanwhile (PG)
            for params in overwrites:
                if conn.execute(admin.OVERWRITE_DONE, params).rowcount == 1:
                    got["replaced"] += 1
                else:
                    got["busy"] += 1
            return got

        for name, n in db.run(work, write=True).items():
            counts[name] += n
        progress(len(batch))

    batch: list[_Incoming] = []
    for where, record in records:
        if isinstance(record, ValueError):
            bad.append({"where": where, "reason": str(record)})
            progress(1)
            continue
        try:
            inc = _validated(where, record)
        except ValueError as e:
            bad.append({"where": where, "reason": str(e)})
            progress(1)
            continue
        if inc.key_hash in seen:
            # Two entries of one key in one file: the first wins, like `keep` would.
            counts["unchanged"] += 1
            progress(1)
            continue
        seen.add(inc.key_hash)
        batch.append(inc)
        if len(batch) >= IMPORT_BATCH:
            flush(batch)
            batch = []
    if batch:
        flush(batch)
    return {"database": db.display_url, "on_conflict": on_conflict, "dry_run": dry_run,
            **counts, "invalid": len(bad), "bad": bad}


def _source_records(src: Database) -> Iterator[tuple[str, Any]]:
    after = ""
    while True:
        page = src.run(lambda c: c.execute(admin.select_done_page(None, after, PAGE)).all())
        if not page:
            return
        for row in page:
            where = f"entry {row.key_hash[:16]}"
            try:
                record = {"key": _stored_key(row.key_json), "key_hash": row.key_hash,
                          "timings": _timings(row.timings_json, row.key_hash),
                          "tune_seconds": row.tune_seconds}
            except InvalidEntryError as e:
                yield where, ValueError(e.reason)
                continue
            except ValueError as e:
                yield where, e
                continue
            yield where, record
        after = page[-1].key_hash


def merge(
    src: Database,
    into: Database,
    *,
    on_conflict: ConflictPolicy = "keep",
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Import every done entry of ``src`` into ``into`` (validated like an import file)."""
    if src.url == into.url:
        raise ConfigError("SRC_DB", src.display_url, "a database other than the target")
    if not dry_run:
        _refuse_readonly(into, "merge")
    if on_total:
        on_total(int(src.run(lambda c: c.execute(admin.count_done(None)).scalar_one())))
    report = import_records(into, _source_records(src), on_conflict=on_conflict,
                            dry_run=dry_run, progress=progress)
    report["source"] = src.display_url
    return report


# -- ls / show / upgrade ---------------------------------------------------------------


def ls(db: Database, env: admin.EntryFilter | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Entries, most recently updated first."""
    rows = db.run(lambda c: c.execute(admin.select_listing(env, limit)).all())
    return [_listing(r) for r in rows]


_HEX = re.compile(r"^[0-9a-f]{4,64}$")


def show(db: Database, prefix: str) -> dict[str, Any]:
    """One entry, by a unique prefix (at least 4 hex digits) of its key hash."""
    prefix = prefix.strip().lower()
    if not _HEX.match(prefix):
        raise ConfigError("KEY_HASH_PREFIX", prefix, "4 to 64 hex digits of a key hash")
    rows = db.run(lambda c: c.execute(admin.select_by_prefix(prefix, 2)).all())
    if not rows:
        raise EntryNotFoundError(prefix, "no entry's key hash starts with it; "
                                 "`tunecache ls` lists entries")
    if len(rows) > 1:
        raise EntryNotFoundError(prefix, "more than one entry's key hash starts with it; "
                                 "give more digits")
    r = rows[0]
    key_error = None
    try:
        key: Any = _stored_key(r.key_json)
    except ValueError as e:
        key, key_error = None, str(e)
    timings: list[dict[str, Any]] = []
    timings_error = None
    if r.timings_json is not None:
        try:
            parsed = _timings(r.timings_json, r.key_hash)
            timings = [{"candidate": k, "ms": None if v == math.inf else v}
                       for k, v in sorted(parsed.items(), key=lambda kv: (kv[1], kv[0]))]
        except InvalidEntryError as e:
            timings_error = e.reason
    return {
        "key_hash": r.key_hash, "key": key, "key_error": key_error, "state": r.state,
        "kind": r.kind, "op": r.op, "device": r.device, "torch": r.torch_version,
        "triton": r.triton_version,
        "timings": timings, "timings_error": timings_error, "best": r.best,
        "tune_seconds": r.tune_seconds, "owner": r.owner, "token": r.token,
        "attempts": r.attempts, "lease_expires_at": r.lease_expires_at, "error": r.error,
        "hits": r.hits, "created_at": r.created_at, "updated_at": r.updated_at,
        "last_used_at": r.last_used_at, "now": r.now,
    }


def upgrade(settings: Settings) -> dict[str, Any]:
    """Run the migrations now (`tunecache upgrade`)."""
    db = Database(settings.db_url, settings.lock_timeout)
    if settings.mode == "readonly":
        raise ReadonlyModeError(db.display_url, "upgrade")
    try:
        before = db.run(current_revision)
        ensure_schema(db, may_migrate=True)
        return {"database": db.display_url, "from": before, "to": db.run(current_revision)}
    finally:
        db.dispose()
