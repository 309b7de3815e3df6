"""Pruning: deleting what a :class:`PruneSpec` selects, in short batches, safely while jobs
run; then, when it pays, VACUUM.

A claim whose lease has not passed is never deleted; a deleted ``done`` entry is simply
tuned again by the next job that needs it. Nothing holds the SQLite write lock for longer
than one batch, and batches pause so that waiting lookups and claims get in.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from sqlalchemy import Connection

from ..errors import ConfigError, FilterMatchesNothingError, InvalidEntryError
from ..keys import KINDS, validate_timings
from ..store import ArtifactStore, Database, engine, prune_queries
from ..store.artifact_queries import GraphFilter
from ..store.artifact_rows import ArtifactInfo
from ..store.entry_filter import EntryFilter
from .browse import show
from .entries import (
    LISTING_KEYS,
    PAGE,
    listing_row,
    noop,
    pages,
    stored_key,
)
from .opening import refuse_readonly
from .statistics import database_size

__all__ = ["PruneSpec", "PruneReport", "GraphPruneReport", "VacuumReport", "prune",
           "prune_graphs", "unmatched_labels", "PRUNE_BATCH", "PRUNE_BATCH_SECONDS",
           "PRUNE_BATCH_MIN", "PRUNE_BATCH_MAX", "PRUNE_PAUSE", "DELETE_BATCH",
           "VACUUM_FREE_SHARE", "VACUUM_AUTO_MAX_BYTES", "DRY_RUN_LISTED", "run_vacuum"]

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
DELETE_BATCH = 500  # invalid entries per delete (SQLite's bound-parameter limit: 999 before 3.32)
# VACUUM (SQLite) after a prune once free pages are this share of the file; see prune().
VACUUM_FREE_SHARE = 0.25
# ... and only on files up to this size: VACUUM copies the surviving entries at about
# 100 MB/s (measured: 1.75 GB kept of 3.5 GB in 33 s) while holding the write lock, so
# past this a running job's claim would wait longer than its lock timeout (30 s default)
# and fall back to tuning locally.
VACUUM_AUTO_MAX_BYTES = 256 * 2**20
# Entries a dry run lists by default (it counts them all).
DRY_RUN_LISTED = 20


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
    # Compiled graphs: beyond this many payload bytes in all, the least recently used go.
    max_graph_bytes: int | None = None

    @property
    def env(self) -> EntryFilter:
        return EntryFilter(keep=self.keep, only=self.only, ops=self.ops, kinds=self.kinds)

    @property
    def graphs(self) -> GraphFilter | None:
        """The compiled graphs the entry filters (--older-than, torch, --kind) select,
        or None: they select graphs only when given, and never with a filter on a label
        graphs lack (op, device, triton)."""
        if self.older_than is None and not self.env:
            return None
        return GraphFilter.of_entries(self.env if self.env else None, self.older_than)

    def is_empty(self) -> bool:
        return not (self.older_than is not None or self.env or self.failed
                    or self.expired_claims or self.invalid or self.max_graph_bytes is not None)


_LABEL_NAMES = {"torch": "torch version", "triton": "triton version", "device": "device"}


def _json(report: Any, optional: tuple[str, ...]) -> dict[str, Any]:
    """The --json document of a prune report: its fields (a nested report as its own
    document), less those of ``optional`` it does not have (None: the other mode's)."""
    data: dict[str, Any] = {}
    for field in dataclasses.fields(report):
        value = getattr(report, field.name)
        if value is None and field.name in optional:
            continue
        data[field.name] = value.to_json() if hasattr(value, "to_json") else value
    return data


@dataclasses.dataclass(frozen=True)
class VacuumReport:
    """Whether a prune ran VACUUM, why (or why not), and how long it took when it ran."""

    ran: bool
    why: str
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        return _json(self, ("seconds",))


@dataclasses.dataclass(frozen=True)
class GraphPruneReport:
    """The compiled graphs a prune selected (by its filters, and over --max-graph-bytes)
    and the orphan blob files it swept; a dry run lists ``graphs`` it ``would_delete``, a
    prune says what it ``deleted`` and freed."""

    selected: int
    over_budget: int
    bytes: int
    max_graph_bytes: int | None
    orphans: Mapping[str, int]
    would_delete: int | None = None
    graphs: tuple[Mapping[str, Any], ...] | None = None
    deleted: int | None = None
    freed_bytes: int | None = None
    kept_because_used: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _json(self, ("would_delete", "graphs", "deleted", "freed_bytes",
                            "kept_because_used"))


@dataclasses.dataclass(frozen=True)
class PruneReport:
    """What a prune deleted, or (``dry_run``) how many entries it would delete and the
    first of them (``entries``: as many as it was asked to list).

    ``graphs`` is None when Ctrl-C stopped it before the graphs (``interrupted``); one
    stopped before VACUUM has no ``vacuum`` and sizes."""

    database: str
    dry_run: bool
    warnings: tuple[str, ...]
    graphs: GraphPruneReport | None
    seconds: float
    would_delete: int | None = None
    entries: tuple[Mapping[str, Any], ...] | None = None
    deleted: int | None = None
    batches: int | None = None
    largest_batch: int | None = None
    invalid: int | None = None
    invalid_deleted: int | None = None
    interrupted: bool | None = None
    vacuum: VacuumReport | None = None
    size_before: Mapping[str, Any] | None = None
    size_after: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return _json(self, ("would_delete", "entries", "deleted", "batches",
                            "largest_batch", "invalid", "invalid_deleted", "interrupted",
                            "vacuum", "size_before", "size_after"))


def check_filters(db: Database, spec: PruneSpec) -> list[str]:
    """Refuse filters that cannot mean what the operator meant, before anything goes.

    A keep filter (--keep-torch ...) with a value no entry or graph holds would keep
    nothing of it and delete everything it applies to (`--keep-torch 2.13.0` where the
    entries say 2.13.0+cpu): refused, with the stored values, so that a typo deletes
    nothing. A --kind neither tunecache's own (keys.KINDS) nor stored is a typo that
    selects nothing: refused with the known kinds. A drop filter (--torch ...) that
    matches nothing deletes nothing: a warning, returned (the report's ``warnings``).
    """
    warnings: list[str] = []
    if spec.kinds:
        known = list(KINDS) + [k for k in db.run(lambda c: prune_queries.stored_labels(c, "kind"))
                               if k not in KINDS]
        for kind in spec.kinds:
            if kind not in known:
                raise ConfigError("--kind", kind, f"one of the known kinds: {', '.join(known)}")
    for name, label in _LABEL_NAMES.items():
        keep, only = spec.keep.get(name) or [], spec.only.get(name) or []
        if not keep and not only:
            continue
        stored = db.run(functools.partial(prune_queries.stored_labels, name=name))
        for value in keep:
            if value not in stored:
                raise FilterMatchesNothingError(f"--keep-{name}", value, label, stored)
        warnings += _unmatched(stored, f"--{name}", only, label)
    return warnings


def _unmatched(stored: list[str], option: str, values: list[str], label: str) -> list[str]:
    return [f"{option} {value} matches no stored {label} (stored: "
            f"{', '.join(stored) or 'none'}); it selects nothing"
            for value in values if value not in stored]


def unmatched_labels(db: Database, option: str, name: str, values: list[str]) -> list[str]:
    """A warning for each value of a selecting filter (``option``, on label ``name``:
    torch, triton or device) that no entry or graph holds: it selects nothing, which is
    most likely a typo. Prune and warm say it the same way."""
    if not values:
        return []
    stored = db.run(functools.partial(prune_queries.stored_labels, name=name))
    return _unmatched(stored, option, values, _LABEL_NAMES[name])


def _invalid_hashes(db: Database) -> Iterator[tuple[str, str]]:
    """(key_hash, reason) of done entries whose key or timings fail validation, page by
    page (the reasons `export` and `merge` skip them for)."""
    for page in pages(db, lambda after: prune_queries.select_done_timings_page(after, PAGE)):
        for row in page:
            try:
                stored_key(row.key_json)
                validate_timings(row.timings_json, row.key_hash)
            except InvalidEntryError as e:
                yield row.key_hash, e.reason
            except ValueError as e:
                yield row.key_hash, str(e)


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
    stop: Callable[[], bool] | None = None,
    on_deleted: Callable[[int], None] | None = None,
    listed: int = DRY_RUN_LISTED,
) -> PruneReport:
    """Delete (or, dry run, count and list the first ``listed`` of) what ``spec``
    selects; see :class:`PruneSpec`.

    ``progress`` and ``on_total`` follow how far the walk is through the table, per
    mille (a count first would scan it all); ``on_deleted`` gets the running count of
    rows deleted after each batch.

    ``stop`` is asked after every committed batch (the CLI's Ctrl-C): once it says True,
    the prune ends there, before compiled graphs and VACUUM if it had not reached them,
    and the report says ``interrupted`` with what was deleted so far, every count of
    which is committed.

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
    progress = progress or noop
    if spec.is_empty():
        raise ConfigError(
            "prune", "(no selection)",
            "at least one of --older-than, --keep-*/--torch/--triton/--device/--op, "
            "--failed, --expired-claims, --invalid, --max-graph-bytes",
        )
    if not dry_run:
        refuse_readonly(db, "prune")
    warnings = check_filters(db, spec)
    started = time.perf_counter()
    condition = prune_queries.prune_condition(
        older_than=spec.older_than, env=spec.env if spec.env else None,
        failed=spec.failed, expired_claims=spec.expired_claims,
    )
    size_before = database_size(db)
    invalid = list(_invalid_hashes(db)) if spec.invalid else []
    if dry_run:
        graphs = prune_graphs(db, spec, dry_run=True)
        would, entries = _prune_listing(db, spec, condition, invalid, listed)
        return PruneReport(db.display_url, dry_run, tuple(warnings), graphs,
                           time.perf_counter() - started, would_delete=would,
                           entries=tuple(entries))

    # No count first: on SQLite that is a scan of the whole file (6 s for a million
    # entries), so the progress bar follows the walk's position instead (per mille).
    if on_total:
        on_total(1000)
    deleted = 0
    batches = 0
    walk = prune_queries.prune_walk_column(db.dialect)
    delete_range = prune_queries.delete_pruned_range(condition, walk)
    size = batch or PRUNE_BATCH[db.dialect]
    timed = batch is None and db.is_sqlite
    largest = 0
    selects_rows = spec.older_than is not None or bool(spec.env) or spec.failed \
        or spec.expired_claims
    top = db.run(lambda c: engine.scalar(c, prune_queries.select_walk_end(walk))) \
        if selects_rows else None
    after: Any = 0 if db.is_sqlite else ""
    shown = 0
    while top is not None:
        def one_batch(conn: Connection, size: int = size,
                      after: Any = after) -> tuple[Any, int, int, float]:
            locked = time.perf_counter()  # the write lock is ours from here (SQLite)
            return (*prune_queries.prune_batch(conn, condition, walk, delete_range, size, after,
                                               top),
                    locked)

        last, n, selected, locked = db.run(one_batch, write=True)
        held = time.perf_counter() - locked  # until the commit is done
        if last is None:
            break
        after = last
        deleted += n
        batches += 1
        if on_deleted:
            on_deleted(deleted)
        largest = max(largest, selected)
        where = _walk_permille(after, top)
        progress(where - shown)
        shown = where
        if timed and selected == size:
            size = _next_batch_size(size, held)
        if stop is not None and stop():
            break
        if pause:
            _yield_lock(db)
    progress(1000 - shown)
    # Invalid entries (done ones only; the condition pass may have taken some already).
    invalid_deleted = 0
    for i in range(0, len(invalid), DELETE_BATCH):
        if stop is not None and stop():
            break
        chunk = [h for h, _ in invalid[i:i + DELETE_BATCH]]
        n = db.run(functools.partial(prune_queries.delete_invalid_done, hashes=chunk), write=True)
        deleted += n
        invalid_deleted += n
        batches += 1
        if on_deleted:
            on_deleted(deleted)

    def done(graphs: GraphPruneReport | None, **rest: Any) -> PruneReport:
        return PruneReport(db.display_url, dry_run, tuple(warnings), graphs,
                           time.perf_counter() - started, deleted=deleted, batches=batches,
                           largest_batch=largest, invalid=len(invalid),
                           invalid_deleted=invalid_deleted, **rest)

    if stop is not None and stop():
        return done(None, interrupted=True)
    graphs = prune_graphs(db, spec, dry_run=False)
    if stop is not None and stop():
        # Graphs are few and deleted in one go; VACUUM, which could be long, is skipped.
        return done(graphs, interrupted=True)
    vacuumed = run_vacuum(db, vacuum, deleted)
    return done(graphs, interrupted=False, vacuum=vacuumed, size_before=size_before,
                size_after=database_size(db))


def prune_graphs(db: Database, spec: PruneSpec, *, dry_run: bool = False
                 ) -> GraphPruneReport:
    """Delete the compiled graphs ``spec`` selects (its entry filters, see
    :attr:`PruneSpec.graphs`), then, with ``max_graph_bytes``, the least recently used of
    the rest until what remains fits; on SQLite also the blob files no row references
    any more, and orphans older than an hour (a publisher that died between its blob and
    its row, a row pruned while its blob was in use).

    Graphs are few (thousands at most) and their rows small: their metadata is read whole,
    and rows are deleted in transactions of at most 500, each row only if it is still the
    one read (a graph used since is kept: see ArtifactStore.delete).
    """
    store = ArtifactStore(db)
    where = spec.graphs
    selected: list[ArtifactInfo] = []
    if where is not None:
        selected = [info for page in store.infos(where) for info in page]
    over_budget: list[ArtifactInfo] = []
    if spec.max_graph_bytes is not None:
        chosen = {(x.kind, x.key) for x in selected}
        rest = [info for page in store.infos() for info in page
                if (info.kind, info.key) not in chosen]
        # A row whose digest or size does not read serves no job (a size out of 0 to
        # MAX_PAYLOAD_BYTES reads as None, and load refuses the row): it goes first,
        # whatever its last use, and is never counted against the budget.
        over_budget = [x for x in rest if x.digest is None or x.size is None]
        rest = [x for x in rest if x.digest is not None and x.size is not None]
        rest.sort(key=lambda x: (-x.last_use, x.kind, x.key))  # most recently used first
        kept = 0
        for i, info in enumerate(rest):
            kept += info.size or 0
            if kept > spec.max_graph_bytes:
                over_budget += rest[i:]  # this one and every one used less recently
                break
    doomed = selected + over_budget
    counted = functools.partial(GraphPruneReport, len(selected), len(over_budget),
                                sum(x.size or 0 for x in doomed), spec.max_graph_bytes)
    if dry_run:
        return counted(store.sweep_orphans(dry_run=True), would_delete=len(doomed),
                     graphs=tuple(x.as_dict() for x in doomed))
    deleted, freed = store.delete(doomed)
    return counted(store.sweep_orphans(), deleted=deleted, freed_bytes=freed,
                 kept_because_used=len(doomed) - deleted)


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


def _why(spec: PruneSpec, state: Any) -> str:
    """Which of ``spec``'s selections took a row of this state (the classes are OR-ed:
    see :func:`tunecache.store.prune_queries.prune_condition`)."""
    if state == "claimed":
        return "--expired-claims"
    if state == "failed" and spec.failed:
        return "--failed"
    given = [("--older-than", spec.older_than is not None), ("--op", bool(spec.ops)),
             ("--kind", bool(spec.kinds))]
    given += [(f"--keep-{name}", bool(v)) for name, v in spec.keep.items()]
    given += [(f"--{name}", bool(v)) for name, v in spec.only.items()]
    return " ".join(option for option, on in given if on)


def _scalars(conn: Connection, statement: Any) -> list[Any]:
    return list(conn.execute(statement).scalars())


def _prune_listing(
    db: Database,
    spec: PruneSpec,
    condition: Any,
    invalid: list[tuple[str, str]],
    listed: int,
) -> tuple[int, list[dict[str, Any]]]:
    """--dry-run: how many entries a prune would delete, counted in SQL, and the first
    ``listed`` of them in key order (then those only --invalid takes). Only the rows
    listed are fetched: paging through every match took 20-30 s on 100,000 entries to
    print 20 of them."""
    matched = int(db.run(lambda c: engine.scalar(c, prune_queries.count_pruned(condition))))
    reasons = dict(invalid)
    # The invalid entries the other selections take too are counted once.
    also_matched: set[str] = set()
    hashes = list(reasons)
    for lo in range(0, len(hashes), DELETE_BATCH):
        among = prune_queries.select_pruned_among(condition, hashes[lo:lo + DELETE_BATCH])
        also_matched.update(db.run(functools.partial(_scalars, statement=among)))
    only_invalid = [(h, reason) for h, reason in invalid if h not in also_matched]
    rows: list[dict[str, Any]] = []
    if matched and listed:
        page = db.run(lambda c: list(c.execute(prune_queries.select_pruned(condition, "",
                                                                            listed))))
        rows.extend({**listing_row(r), "why": _why(spec, r.state)} for r in page)
    for row in rows:
        if row["key_hash"] in reasons:
            row["invalid"] = reasons[row["key_hash"]]
            row["why"] += f" --invalid: {row['invalid']}"
    for h, reason in only_invalid[:max(0, listed - len(rows))]:
        got = show(db, h)
        rows.append({**{k: getattr(got, k) for k in LISTING_KEYS}, "invalid": reason,
                     "why": f"--invalid: {reason}"})
    return matched + len(only_invalid), rows


def run_vacuum(db: Database, mode: str, deleted: int) -> VacuumReport:
    if mode == "never" or (mode == "auto" and not deleted):
        return VacuumReport(False, "not asked" if mode == "never" else "nothing deleted")
    if db.is_sqlite:
        size = database_size(db)
        share = size["free_bytes"] / size["bytes"] if size["bytes"] else 0.0
        if mode == "auto" and share < VACUUM_FREE_SHARE:
            return VacuumReport(False, f"free pages are {share:.0%} of the file "
                                f"(under {VACUUM_FREE_SHARE:.0%}); SQLite reuses them for new "
                                "entries")
        if mode == "auto" and size["bytes"] > VACUUM_AUTO_MAX_BYTES:
            return VacuumReport(False, f"free pages are {share:.0%} of the file, but "
                                f"VACUUM of {size['bytes'] / 2**20:.0f} MiB would hold the "
                                "lock for tens of seconds; run `tunecache prune --vacuum ...` "
                                "when no job runs")
        why = "asked" if mode == "always" else f"free pages were {share:.0%} of the file"
    else:
        why = "asked" if mode == "always" else "rows deleted; plain VACUUM makes space reusable"
    started = time.perf_counter()
    # VACUUM cannot run inside a transaction: a "read" run is autocommit on both engines.
    db.run(prune_queries.vacuum)
    return VacuumReport(True, why, time.perf_counter() - started)


