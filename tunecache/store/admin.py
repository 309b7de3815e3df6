"""Named statements of the operator commands (stats, prune, export/import, ls/show).

SQLAlchemy Core only; every statement is built here, once, and called by name from
:mod:`tunecache.ops`, and the transaction bodies that run them (functions of a Connection,
which :meth:`Database.run` calls in one transaction). Nothing here runs in the claim path of
a compiling job.

Deletes are bounded: a prune transaction deletes one batch of rows, a range of the key
order, and the DELETE repeats the selection's conditions in its own WHERE. On PostgreSQL
(READ COMMITTED) a row claimed between the SELECT of a batch and its DELETE is re-checked
against the DELETE's WHERE on its new version (EvalPlanQual), so a claim taken meanwhile
is never deleted; on SQLite the transaction holds the write lock, so nothing changes in
between.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Float,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    column,
    delete,
    false,
    func,
    not_,
    null,
    or_,
    select,
    text,
    true,
    update,
)

from .. import stored_json
from ..keys import (
    MAX_CANDIDATE_NAME,
    MAX_FAMILY,
    MAX_KEY_BYTES,
    MAX_LABEL,
    MAX_META_BYTES,
    MAX_TIMINGS_BYTES,
)
from . import columns, gains
from .claims import (
    LEASE_PASSED,
    LEASE_RUNNING,
    MAX_ERROR_BYTES,
    MAX_STATE,
    db_now,
    insert_if_absent,
)
from .columns import bounded
from .schema import artifacts, entries, usage

__all__ = [
    "STATS_GROUPS",
    "USAGE_TOTALS",
    "CLAIMS_LIVE",
    "CLAIMS_EXPIRED_COUNT",
    "FAILED_KEYS",
    "PG_DATABASE_SIZE",
    "SQLITE_PAGE_COUNT",
    "SQLITE_FREELIST_COUNT",
    "SQLITE_PAGE_SIZE",
    "SQLITE_VACUUM",
    "PG_VACUUM_ENTRIES",
    "NOW",
    "EntryFilter",
    "prune_condition",
    "select_pruned",
    "count_pruned",
    "sqlite_prune_pragmas",
    "prune_walk_column",
    "select_prune_batch",
    "select_walk_end",
    "delete_pruned_range",
    "select_done_page",
    "select_transferred_page",
    "select_warm_page",
    "warm_page",
    "WARM_KEY_BYTES",
    "select_done_timings_page",
    "delete_invalid",
    "count_done",
    "select_listing",
    "select_by_prefix",
    "read_for_import",
    "stats_groups",
    "select_gains_page",
    "GAINS_GROUPS",
    "top_gains",
    "stored_labels",
    "usage_totals",
    "live_claims",
    "expired_claims_count",
    "failed_keys",
    "sqlite_size",
    "pg_database_size",
    "vacuum",
    "scalar",
    "rows",
    "prune_batch",
    "delete_invalid_done",
    "existing_for_import",
    "ImportedEntry",
    "insert_done_rows",
    "overwrite_done",
]

NOW = db_now()

# -- stats ----------------------------------------------------------------------------

# One scan of the table for everything stats reports per group; the groups are few (states
# x ops x environments), so Python sums them up. Several GROUP BYs would scan it several
# times, which on a million entries is the difference between under and over two seconds.
_STATS_GROUP = (
    entries.c.state,
    entries.c.kind,
    entries.c.op,
    entries.c.device,
    entries.c.torch_version,
    entries.c.triton_version,
)
# Each row's counts and times are summed only within the range a writer stores, so a
# planted NaN, infinity, huge integer (SQLite's SUM raises on overflow) or text costs only
# its own row: text compares greater than any number in SQLite, NaN greater than any on
# PostgreSQL.
_HITS = case((and_(entries.c.hits >= 0, entries.c.hits <= 2**31 - 1), entries.c.hits), else_=0)
_TUNE_SECONDS = case((and_(entries.c.tune_seconds >= 0,
                           entries.c.tune_seconds <= stored_json.MAX_NUMBER),
                      entries.c.tune_seconds), else_=0.0)
STATS_GROUPS = select(
    # Each label as NULL past the length a writer stores (keys.MAX_LABEL): a planted
    # megabyte-long op never leaves the database (grouped by the stored value all the same).
    *(columns.bounded(c, MAX_LABEL) for c in _STATS_GROUP),
    func.count().label("entries"),
    func.coalesce(func.sum(_HITS), 0).label("hits"),
    func.coalesce(func.sum(_TUNE_SECONDS), 0.0).label("tune_seconds"),
    func.coalesce(func.sum(_HITS * _TUNE_SECONDS), 0.0).label("saved_seconds"),
).group_by(*_STATS_GROUP)

USAGE_TOTALS = select(
    func.count().label("reports"),
    func.coalesce(func.sum(usage.c.hits), 0).label("hits"),
    func.coalesce(func.sum(usage.c.tuned), 0).label("tuned"),
    func.coalesce(func.sum(usage.c.peer), 0).label("peer"),
    func.coalesce(func.sum(usage.c.local), 0).label("local"),
    func.coalesce(func.sum(usage.c.seconds_saved), 0.0).label("seconds_saved"),
    func.coalesce(func.sum(usage.c.seconds_tuning), 0.0).label("seconds_tuning"),
    func.min(usage.c.recorded_at).label("first"),
    func.max(usage.c.recorded_at).label("last"),
)

_CLAIM_COLUMNS = (
    columns.bounded(entries.c.key_hash, 64),
    columns.bounded(entries.c.op, MAX_LABEL),
    columns.bounded(entries.c.owner, MAX_LABEL),
    entries.c.token,
    entries.c.attempts,
    entries.c.updated_at,
    entries.c.lease_expires_at,
    NOW.label("now"),
)
# Claims use the state index; there are at most a few thousand in flight.
CLAIMS_LIVE = (
    select(*_CLAIM_COLUMNS)
    .where(entries.c.state == "claimed", LEASE_RUNNING)
    .order_by(entries.c.updated_at)
    .limit(bindparam("p_limit"))
)
# Expired: passed, or a lease no owner could have set (claims.lease_passed).
CLAIMS_EXPIRED_COUNT = select(func.count()).where(entries.c.state == "claimed", LEASE_PASSED)
FAILED_KEYS = (
    select(columns.bounded(entries.c.key_hash, 64), columns.bounded(entries.c.op, MAX_LABEL),
           entries.c.attempts, columns.bounded(entries.c.error, MAX_ERROR_BYTES),
           entries.c.updated_at)
    .where(entries.c.state == "failed")
    .order_by(entries.c.updated_at.desc())
    .limit(bindparam("p_limit"))
)



# "What tuning bought" sums the gain columns each writer computed (tunecache.store.gains),
# each within the range a writer stores (as STATS_GROUPS does). Both statements read only
# ix_tunecache_entries_gains, which covers them: one scan of that narrow index, not of the
# wide rows (on 100,000 entries each scan of the table took 0.2-0.5 s).
def _ms(col: ColumnElement[Any]) -> ColumnElement[bool]:
    return and_(col > 0, col <= stored_json.MAX_NUMBER)


def _count(col: ColumnElement[Any]) -> ColumnElement[Any]:
    return case((and_(col >= 0, col <= gains.MAX_COUNT), col), else_=0)


def _when(condition: ColumnElement[bool], value: Any, otherwise: Any = 0) -> ColumnElement[Any]:
    return case((condition, value), else_=otherwise)


_COMPUTED = entries.c.gain_state == gains.COMPUTED
_HAS_GAIN = and_(_COMPUTED, _ms(entries.c.gain_baseline_ms), _ms(entries.c.gain_best_ms))
_MOVED = and_(_COMPUTED, entries.c.transfer_generated.is_not(None))
_REGRET = _when(and_(_MOVED, _ms(entries.c.transfer_regret)), entries.c.transfer_regret, null())
# Per kind and op (and gain_state): entries with a gain and their sums; transferred
# entries and theirs; entries whose texts did not read (skipped).
GAINS_GROUPS = (
    select(columns.bounded(entries.c.kind, MAX_LABEL), columns.bounded(entries.c.op, MAX_LABEL),
           func.sum(_when(_HAS_GAIN, 1)).label("entries"),
           func.sum(_when(_HAS_GAIN, entries.c.gain_baseline_ms, 0.0)).label("baseline_ms"),
           func.sum(_when(_HAS_GAIN, entries.c.gain_best_ms, 0.0)).label("best_ms"),
           func.sum(_when(_HAS_GAIN, _TUNE_SECONDS, 0.0)).label("tune_seconds"),
           func.sum(_when(_MOVED, 1)).label("transferred"),
           func.sum(_when(_MOVED, _count(entries.c.transfer_benchmarked))).label("benchmarked"),
           func.sum(_when(_MOVED, _count(entries.c.transfer_generated))).label("generated"),
           func.count(_REGRET).label("regret_measured"),
           func.sum(_REGRET).label("regret_sum"), func.max(_REGRET).label("regret_max"),
           func.sum(_when(entries.c.gain_state == gains.UNREADABLE, 1)).label("skipped"))
    # A range on gain_state, and gain_state first in the groups (the caller adds up a
    # kind and op's groups): SQLite then reads the gains index alone, where it took the
    # stats index (ordered by kind and op) and read every row, three times slower.
    .where(entries.c.state == "done", entries.c.gain_state >= gains.COMPUTED)
    .group_by(entries.c.gain_state, entries.c.kind, entries.c.op)
)
_TOP_KEYS = (
    select(entries.c.key_hash)
    .where(entries.c.state == "done", _HAS_GAIN)
    .order_by((entries.c.gain_baseline_ms - entries.c.gain_best_ms).desc(),
              entries.c.key_hash.desc())
    .limit(bindparam("p_limit"))
)


def _gain_texts() -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """An entry's meta and (GEMM only: no other kind's baseline comes from them) timings,
    NULL past the size a reader takes, so Triton entries' candidate lists are never read."""
    return (columns.bounded(entries.c.meta_json, MAX_META_BYTES),
            case((entries.c.kind == "gemm",
                  columns.bounded(entries.c.timings_json, MAX_TIMINGS_BYTES)),
                 else_=null()).label("timings_json"))


_TOP_ROWS = (
    select(columns.bounded(entries.c.key_hash, 64), columns.bounded(entries.c.kind, MAX_LABEL),
           columns.bounded(entries.c.op, MAX_LABEL), entries.c.hits,
           entries.c.tune_seconds, entries.c.gain_baseline_ms, entries.c.gain_best_ms,
           *_gain_texts())
    .where(entries.c.key_hash.in_(bindparam("p_hashes", expanding=True)))
)


def top_gains(conn: Connection, limit: int) -> list[Any]:
    """The ``limit`` entries that save the most per call (found in the index), with the
    texts that name their baseline candidate (read for those rows only)."""
    hashes = conn.execute(_TOP_KEYS, {"p_limit": limit}).scalars().all()
    return list(conn.execute(_TOP_ROWS, {"p_hashes": hashes})) if hashes else []


def select_gains_page(after: str, limit: int) -> Select[Any]:
    """A page (keyset by key_hash) of the done entries whose gain columns no writer
    computed (``gain_state`` NULL), which stats reads itself: GEMM entries (a baseline is
    derivable from their timings) and any other with a meta object."""
    return (
        # key_hash as stored: it is the page's keyset (a primary key no writer makes
        # longer than 64).
        select(entries.c.key_hash, columns.bounded(entries.c.kind, MAX_LABEL),
               columns.bounded(entries.c.op, MAX_LABEL), entries.c.hits,
               entries.c.tune_seconds, *_gain_texts())
        .where(entries.c.state == "done", entries.c.gain_state.is_(None),
               entries.c.key_hash > after,
               or_(entries.c.kind == "gemm", entries.c.meta_json.is_not(None)))
        .order_by(entries.c.key_hash)
        .limit(limit)
    )


PG_DATABASE_SIZE = select(func.pg_database_size(func.current_database()))
# PRAGMAs have no Core spelling; these are fixed texts, nothing is formatted into them.
SQLITE_PAGE_COUNT = text("PRAGMA page_count")
SQLITE_FREELIST_COUNT = text("PRAGMA freelist_count")
SQLITE_PAGE_SIZE = text("PRAGMA page_size")
SQLITE_VACUUM = text("VACUUM")
# Plain VACUUM (not FULL): it marks dead rows reusable without locking out readers or
# writers. VACUUM FULL would shrink the files but takes an ACCESS EXCLUSIVE lock.
PG_VACUUM_ENTRIES = text("VACUUM (ANALYZE) tunecache_entries")


# -- filters shared by prune, ls and export ----------------------------------------------

class EntryFilter:
    """Conditions on the label columns, built from operator options.

    ``keep``: match entries whose label is set and is none of these (prune --keep-torch:
    entries without that label, i.e. not written under the key convention, are left
    alone); ``only``: match entries whose label is one of these (prune --torch, ls --torch);
    ``ops``/``kinds``/``states``: match only these.
    """

    _COLUMNS: ClassVar[dict[str, Any]] = {
        "device": entries.c.device,
        "torch": entries.c.torch_version,
        "triton": entries.c.triton_version,
    }

    def __init__(
        self,
        *,
        keep: Mapping[str, Sequence[str]] | None = None,
        only: Mapping[str, Sequence[str]] | None = None,
        ops: Sequence[str] = (),
        kinds: Sequence[str] = (),
        states: Sequence[str] = (),
    ) -> None:
        self.keep = {k: list(v) for k, v in (keep or {}).items() if v}
        self.only = {k: list(v) for k, v in (only or {}).items() if v}
        self.ops = list(ops)
        self.kinds = list(kinds)
        self.states = list(states)

    def __bool__(self) -> bool:
        return bool(self.keep or self.only or self.ops or self.kinds or self.states)

    def condition(self) -> ColumnElement[bool]:
        parts: list[ColumnElement[bool]] = []
        for name, values in self.keep.items():
            col = self._COLUMNS[name]
            parts.append(and_(col.is_not(None), col.not_in(values)))
        for name, values in self.only.items():
            parts.append(self._COLUMNS[name].in_(values))
        if self.ops:
            parts.append(entries.c.op.in_(self.ops))
        if self.kinds:
            parts.append(entries.c.kind.in_(self.kinds))
        if self.states:
            parts.append(entries.c.state.in_(self.states))
        return and_(true(), *parts)


# -- prune -----------------------------------------------------------------------------

_LAST_USE = func.coalesce(entries.c.last_used_at, entries.c.updated_at)
_CLAIM_EXPIRED = and_(entries.c.state == "claimed", LEASE_PASSED)


def prune_condition(
    *,
    older_than: float | None,
    env: EntryFilter | None,
    failed: bool,
    expired_claims: bool,
) -> ColumnElement[bool]:
    """What a prune deletes, as one condition. Never matches a live claim.

    The classes are OR-ed: ``--failed`` rows, expired claims, and done/failed entries that
    match every entry filter given (``older_than`` seconds since last use, env filters).
    """
    classes: list[ColumnElement[bool]] = []
    if failed:
        classes.append(entries.c.state == "failed")
    if expired_claims:
        classes.append(_CLAIM_EXPIRED)
    entry_parts: list[ColumnElement[bool]] = []
    if older_than is not None:
        entry_parts.append(NOW - bindparam("p_older_than", older_than) > _LAST_USE)
    if env:
        entry_parts.append(env.condition())
    if entry_parts:
        classes.append(and_(entries.c.state.in_(["done", "failed"]), *entry_parts))
    if not classes:
        return false()
    # Belt and braces: whatever the classes say, a claim whose lease runs is someone's work.
    return and_(or_(*classes), not_(and_(entries.c.state == "claimed", LEASE_RUNNING)))


# Stored text as ls, show and prune read it: a column longer than any writer stores comes
# back NULL from the database itself (columns.bounded), so a planted 32 MiB value is
# never read into memory; the readers already treat NULL as absent or invalid.
_LISTING_COLUMNS = (
    entries.c.key_hash,
    bounded(entries.c.state, MAX_LABEL),
    bounded(entries.c.kind, MAX_LABEL),
    bounded(entries.c.op, MAX_LABEL),
    bounded(entries.c.device, MAX_LABEL),
    bounded(entries.c.torch_version, MAX_LABEL),
    bounded(entries.c.triton_version, MAX_LABEL),
    entries.c.hits,
    bounded(entries.c.best, MAX_CANDIDATE_NAME),
    entries.c.tune_seconds,
    bounded(entries.c.owner, MAX_LABEL),
    entries.c.created_at,
    entries.c.updated_at,
    entries.c.last_used_at,
)


def select_pruned(condition: ColumnElement[bool], after: str, limit: int) -> Select[Any]:
    """A page (keyset by key_hash) of what a prune would delete: for --dry-run listings."""
    return (
        select(*_LISTING_COLUMNS)
        .where(condition, entries.c.key_hash > after)
        .order_by(entries.c.key_hash)
        .limit(limit)
    )


def count_pruned(condition: ColumnElement[bool]) -> Select[Any]:
    return select(func.count()).where(condition)


# SQLite's rowid: the table's physical order. Core has no spelling for it but a column
# clause; the name is a constant, nothing is formatted into SQL.
SQLITE_ROWID = column("rowid", Integer)


def prune_walk_column(dialect: str) -> ColumnElement[Any]:
    """The order a prune walks the table in, batch after batch.

    SQLite: rowid, the physical order. A batch then deletes rows that sit on neighbouring
    pages, so it dirties (and journals, and fsyncs) half as many pages as a batch of
    random key hashes (measured on 200k entries: 0.21 s against 0.42 s per 2000 rows).
    PostgreSQL: the primary key (a delete only marks tuples; order matters little).
    """
    return SQLITE_ROWID if dialect == "sqlite" else entries.c.key_hash


def select_prune_batch(condition: ColumnElement[bool], batch: int,
                       walk: ColumnElement[Any]) -> Select[Any]:
    """Where the next batch of at most ``batch`` rows to delete in (``p_after``, ``p_top``]
    ends.

    Walking an order (keyset) matters: a plain ``LIMIT`` subquery would rescan every kept
    row in front of the first match on each batch, quadratic in the table size. The walk
    stops at ``p_top``, the end read when the prune started: on SQLite new rows get the
    next rowids, and a prune that walked on (``--older-than 0s`` matches them too) chased
    running jobs' inserts until they stopped (16-19 s on 300 keys with 8 writers).
    """
    return (
        select(walk)
        .where(condition, walk > bindparam("p_after"), walk <= bindparam("p_top"))
        .order_by(walk)
        .limit(batch)
    )


def select_walk_end(walk: ColumnElement[Any]) -> Select[Any]:
    """The last position of a prune's walk (max rowid or key hash): an index lookup."""
    return select(func.max(walk)).select_from(entries)


def delete_pruned_range(condition: ColumnElement[bool], walk: ColumnElement[Any]) -> Any:
    """Delete the rows of (``p_after``, ``p_last``] that still match ``condition`` (see the
    module docstring: the condition is checked again by the DELETE itself)."""
    return delete(entries).where(
        walk > bindparam("p_after"),
        walk <= bindparam("p_last"),
        condition,
    )


# Per prune transaction on SQLite. A batch dirties a page per row and a share of every
# random index (tunecache.ops.pruning.PRUNE_BATCH): 30-40k pages for 20000 rows, 120-160 MB. Past
# the page cache they spill to the file mid-transaction (an extra journal sync, and the
# exclusive lock, which blocks readers, taken early): 256 MiB (the pages are allocated as
# used, and freed when the prune's process ends) took 20000-row batches of 1M entries
# from 1.13 to 0.98 s against 64 MiB. secure_delete (on in Debian's and other
# distributions' builds) zeroes every freed page, i.e. writes and journals pages a delete
# would otherwise only unlink; FAST still zeroes what is rewritten anyway. Tuning timings
# are no secret. Both are per connection, and the connection goes back to the pool, where
# a library caller's later transactions would keep a 256 MiB cache: each batch puts the
# connection's own values back.
_SQLITE_PRUNE_PRAGMAS = {"cache_size": "-262144", "secure_delete": "FAST"}


@contextmanager
def sqlite_prune_pragmas(conn: Connection) -> Iterator[None]:
    """Run a prune batch with the page cache and secure_delete above, then restore them."""
    before = {name: conn.execute(text(f"PRAGMA {name}")).scalar_one()
              for name in _SQLITE_PRUNE_PRAGMAS}
    for name, value in _SQLITE_PRUNE_PRAGMAS.items():
        conn.execute(text(f"PRAGMA {name}={value}"))
    try:
        yield
    finally:
        for name, value in before.items():
            conn.execute(text(f"PRAGMA {name}={int(value)}"))


def select_done_timings_page(after: str, limit: int) -> Select[Any]:
    """A page of done entries' key and timings columns, for prune --invalid."""
    return (
        select(entries.c.key_hash, bounded(entries.c.key_json, MAX_KEY_BYTES),
               bounded(entries.c.timings_json, MAX_TIMINGS_BYTES))
        .where(entries.c.state == "done", entries.c.key_hash > after)
        .order_by(entries.c.key_hash)
        .limit(limit)
    )


# Done rows are immutable, so a hash found invalid stays invalid; the state guard keeps
# a row that was re-tuned meanwhile (deleted, then claimed again) out of reach.
delete_invalid = delete(entries).where(
    entries.c.key_hash.in_(bindparam("p_hashes", expanding=True)), entries.c.state == "done"
)


# -- export / merge ----------------------------------------------------------------------

# Every text column bounded by the database (columns.bounded): a row's oversized value
# comes back NULL, and the row is then skipped or its family and meta dropped, as for any
# unreadable value, without the value ever being read.
_EXPORT_COLUMNS = (
    entries.c.key_hash,
    bounded(entries.c.key_json, MAX_KEY_BYTES),
    bounded(entries.c.timings_json, MAX_TIMINGS_BYTES),
    entries.c.tune_seconds,
    entries.c.created_at,
    entries.c.updated_at,
    entries.c.last_used_at,
    # Provenance (migration 0006): an exported entry keeps how it was found. has_* say
    # whether one was stored, so that one dropped as unreadable is counted.
    bounded(entries.c.family, MAX_FAMILY),
    bounded(entries.c.meta_json, MAX_META_BYTES),
    entries.c.family.is_not(None).label("has_family"),
    entries.c.meta_json.is_not(None).label("has_meta"),
)


def select_done_page(env: EntryFilter | None, after: str, limit: int) -> Select[Any]:
    """A page of done entries in key_hash order (keyset pagination: no long transaction
    and no OFFSET rescans while a million rows stream out)."""
    cond = env.condition() if env else true()
    return (
        select(*_EXPORT_COLUMNS)
        .where(entries.c.state == "done", entries.c.key_hash > after, cond)
        .order_by(entries.c.key_hash)
        .limit(limit)
    )


# What warm reads of a row, bounded in SQL (columns.bounded): a key warm can rebuild has an
# inputs key of at most 4096 characters (warm.inputs), so it is far under WARM_KEY_BYTES;
# a transferred entry holds only the candidates its transfer kept (a few templates and the
# extern kernels), far under WARM_TIMINGS_BYTES. A longer value comes back NULL, and the
# key is skipped with its reason.
WARM_KEY_BYTES = 16 * 1024
WARM_TIMINGS_BYTES = 64 * 1024


def select_warm_page(env: EntryFilter | None, after: str, limit: int) -> Select[Any]:
    """A page of done entries' (key hash, key JSON) in key_hash order, for `warm`."""
    cond = env.condition() if env else true()
    return (
        select(entries.c.key_hash, bounded(entries.c.key_json, WARM_KEY_BYTES))
        .where(entries.c.state == "done", entries.c.key_hash > after, cond)
        .order_by(entries.c.key_hash)
        .limit(limit)
    )


def select_transferred_page(env: EntryFilter | None, after: str, limit: int) -> Select[Any]:
    """A page of done GEMM entries whose meta mentions "transfer" (tuned from neighbours'
    candidates), for `warm --exhaustive`; the caller validates the meta (LIKE only
    narrows the read: '_' and '%' do not occur in the pattern)."""
    cond = env.condition() if env else true()
    return (
        select(entries.c.key_hash, bounded(entries.c.key_json, WARM_KEY_BYTES),
               bounded(entries.c.timings_json, WARM_TIMINGS_BYTES),
               bounded(entries.c.meta_json, MAX_META_BYTES))
        .where(entries.c.state == "done", entries.c.kind == "gemm",
               entries.c.meta_json.like('%"transfer"%'), entries.c.key_hash > after, cond)
        .order_by(entries.c.key_hash)
        .limit(limit)
    )


def count_done(env: EntryFilter | None) -> Select[Any]:
    cond = env.condition() if env else true()
    return select(func.count()).where(entries.c.state == "done", cond)


# The state compared and the timings a conflict policy compares (`faster`), bounded: a
# state past any real one's length, or timings past their limit, come back NULL (no
# state a policy knows; invalid timings, which lose to any result).
read_for_import = select(
    entries.c.key_hash,
    bounded(entries.c.state, MAX_STATE),
    entries.c.token,
    entries.c.lease_expires_at,
    bounded(entries.c.timings_json, MAX_TIMINGS_BYTES),
    NOW.label("now"),
).where(entries.c.key_hash.in_(bindparam("p_hashes", expanding=True)))


# -- ls / show -------------------------------------------------------------------------------

def select_listing(env: EntryFilter | None, limit: int) -> Select[Any]:
    cond = env.condition() if env else true()
    return (
        select(*_LISTING_COLUMNS)
        .where(cond)
        .order_by(entries.c.updated_at.desc(), entries.c.key_hash)
        .limit(limit)
    )


def select_by_prefix(prefix: str, limit: int = 2) -> Select[Any]:
    """Rows whose hash starts with ``prefix`` (hex only: the caller checks, so LIKE's
    wildcards cannot appear). A range, not LIKE, so the primary key index serves it."""
    upper = prefix + "g"  # 'g' sorts after every hex digit
    return (
        select(*_LISTING_COLUMNS, bounded(entries.c.key_json, MAX_KEY_BYTES),
               bounded(entries.c.timings_json, MAX_TIMINGS_BYTES), entries.c.token,
               entries.c.attempts, entries.c.lease_expires_at,
               bounded(entries.c.error, MAX_ERROR_BYTES), NOW.label("now"))
        .where(entries.c.key_hash >= prefix, entries.c.key_hash < upper)
        .order_by(entries.c.key_hash)
        .limit(limit)
    )


# -- import and merge ----------------------------------------------------------------


def insert_done(dialect: str, owner: str) -> Any:
    """Import: a done entry, unless the key exists (then the conflict policy decides)."""
    return insert_if_absent(
        dialect,
        returning=False,
        state="done",
        owner=owner,
        lease_expires_at=None,
        attempts=0,
        timings_json=bindparam("p_timings_json"),
        best=bindparam("p_best"),
        tune_seconds=bindparam("p_tune_seconds"),
        meta_json=bindparam("p_meta_json"),
        **gains.assignments(),
        # The source's times, where it gave them: an imported entry is as old, and was
        # last used as long ago, as where it came from (prune --older-than reads them).
        created_at=func.coalesce(bindparam("p_created_at", type_=Float), NOW),
        updated_at=func.coalesce(bindparam("p_updated_at", type_=Float), NOW),
        last_used_at=bindparam("p_last_used_at", type_=Float),
    )


# Overwrite a row under its token: a claim taken or a result published meanwhile bumps or
# changes it, and the update then matches nothing (reported as busy), like a stale publish.
OVERWRITE_DONE = (
    update(entries)
    .where(entries.c.key_hash == bindparam("p_key_hash"), entries.c.token == bindparam("p_token"),
           entries.c.state == bindparam("p_state"))
    .values(
        state="done",
        owner=bindparam("p_owner"),
        token=entries.c.token + 1,
        lease_expires_at=None,
        error=None,
        timings_json=bindparam("p_timings_json"),
        best=bindparam("p_best"),
        tune_seconds=bindparam("p_tune_seconds"),
        # The incoming entry's provenance replaces the old one's with its timings.
        family=bindparam("p_family"),
        meta_json=bindparam("p_meta_json"),
        updated_at=NOW,
        **gains.assignments(),
    )
)


# -- transaction bodies ----------------------------------------------------------------
# Functions of a Connection: tunecache.ops hands them to Database.run (one transaction
# each) and never executes a statement itself.


def scalar(conn: Connection, statement: Any) -> Any:
    """The one value of ``statement`` (a count, a walk's end); None when it has no row."""
    return conn.execute(statement).scalar()


def rows(conn: Connection, statement: Any) -> list[Any]:
    """Every row of ``statement`` (a page of a listing or of an export)."""
    return list(conn.execute(statement).all())


def warm_page(conn: Connection, env: EntryFilter | None, after: str, limit: int) -> list[Any]:
    """A page of done entries after key hash ``after`` (see :func:`select_warm_page`)."""
    return list(conn.execute(select_warm_page(env, after, limit)).all())


def stats_groups(conn: Connection) -> list[Any]:
    return list(conn.execute(STATS_GROUPS).all())


# The columns prune's filters compare, in entries and (where graphs have one) in
# compiled graphs' rows.
_LABEL_COLUMNS = {
    "torch": (entries.c.torch_version, artifacts.c.torch_version),
    "triton": (entries.c.triton_version,),
    "device": (entries.c.device,),
    "kind": (entries.c.kind, artifacts.c.kind),
}


def stored_labels(conn: Connection, name: str) -> list[str]:
    """Every distinct value of a label (torch, triton, device, kind) that an entry or a
    compiled graph holds, sorted; one scan of each table."""
    found: set[str] = set()
    for col in _LABEL_COLUMNS[name]:
        found.update(v for v in conn.execute(select(col).distinct()).scalars()
                     if isinstance(v, str))
    return sorted(found)


def usage_totals(conn: Connection) -> Any:
    return conn.execute(USAGE_TOTALS).one()


def live_claims(conn: Connection, limit: int) -> list[Any]:
    return list(conn.execute(CLAIMS_LIVE, {"p_limit": limit}).all())


def expired_claims_count(conn: Connection) -> int:
    return int(conn.execute(CLAIMS_EXPIRED_COUNT).scalar_one())


def failed_keys(conn: Connection, limit: int) -> list[Any]:
    return list(conn.execute(FAILED_KEYS, {"p_limit": limit}).all())


def sqlite_size(conn: Connection) -> tuple[int, int, int]:
    """(page count, free pages, page size) of a SQLite database."""
    return (int(conn.execute(SQLITE_PAGE_COUNT).scalar_one()),
            int(conn.execute(SQLITE_FREELIST_COUNT).scalar_one()),
            int(conn.execute(SQLITE_PAGE_SIZE).scalar_one()))


def pg_database_size(conn: Connection) -> int:
    return int(conn.execute(PG_DATABASE_SIZE).scalar_one())


def vacuum(conn: Connection) -> None:
    """VACUUM (SQLite: the whole file; PostgreSQL: plain VACUUM of the entries table).

    It cannot run inside a transaction: the caller runs it as a read (autocommit on both
    engines)."""
    sqlite = conn.dialect.name == "sqlite"
    conn.execute(SQLITE_VACUUM if sqlite else PG_VACUUM_ENTRIES)


def prune_batch(conn: Connection, condition: ColumnElement[bool], walk: ColumnElement[Any],
                delete_range: Any, size: int, after: Any, top: Any) -> tuple[Any, int, int]:
    """Delete the next batch of at most ``size`` rows matching ``condition`` after
    ``after`` (up to ``top``) in the walk's order: (its last position or None when there
    is none, rows deleted, rows selected)."""
    sqlite = conn.dialect.name == "sqlite"
    with sqlite_prune_pragmas(conn) if sqlite else _nothing():
        select_batch = select_prune_batch(condition, size, walk)
        ends = conn.execute(select_batch, {"p_after": after, "p_top": top}).scalars().all()
        if not ends:
            return None, 0, 0
        result = conn.execute(delete_range, {"p_after": after, "p_last": ends[-1]})
        return ends[-1], result.rowcount, len(ends)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def delete_invalid_done(conn: Connection, hashes: Sequence[str]) -> int:
    """Delete these done entries (found invalid); rows deleted."""
    return conn.execute(delete_invalid, {"p_hashes": list(hashes)}).rowcount


def existing_for_import(conn: Connection, hashes: Sequence[str]) -> dict[str, Any]:
    """The rows of these key hashes already in the target, by key hash."""
    return {r.key_hash: r for r in conn.execute(read_for_import, {"p_hashes": list(hashes)})}


@dataclasses.dataclass(frozen=True)
class ImportedEntry:
    """A done entry to write by import or merge, validated by the caller: its key (hash,
    canonical JSON, label columns), result, and the times its source gave (None where it
    gave none)."""

    key_hash: str
    key_json: str
    labels: Mapping[str, str | None]  # column name -> value (keys.key_labels)
    timings_json: str
    best: str
    tune_seconds: float | None
    times: Mapping[str, float | None]  # created_at, updated_at, last_used_at
    family: str | None = None
    meta_json: str | None = None

    def _result(self) -> dict[str, Any]:
        return {"p_key_hash": self.key_hash, "p_timings_json": self.timings_json,
                "p_best": self.best, "p_tune_seconds": self.tune_seconds,
                "p_family": self.family, "p_meta_json": self.meta_json,
                **gains.params(self.labels.get("kind"), self.timings_json, self.meta_json)}


# The rows of an import batch that went in: the importer's own owner on a done row of
# those keys (an overwritten row's key is never in the same insert batch).
_COUNT_IMPORTED = select(func.count()).where(
    entries.c.key_hash.in_(bindparam("p_hashes", expanding=True)),
    entries.c.owner == bindparam("p_owner"), entries.c.state == "done")


def insert_done_rows(conn: Connection, owner: str, incoming: Sequence[ImportedEntry]) -> int:
    """Insert done entries whose key is absent; how many went in (PostgreSQL: a key
    claimed by a job meanwhile is skipped).

    One statement executed for many rows, without RETURNING: the driver then runs it as
    its executemany (psycopg 3 pipelines it, the query converted once), and one count
    says how many went in. With RETURNING, SQLAlchemy sends one multi-row INSERT whose
    thousands of placeholders psycopg converts anew every batch: profiled on 10,000
    lines, that conversion was most of PostgreSQL's import time."""
    params = [{**e._result(), "p_key_json": e.key_json,
               **{f"p_{k}": v for k, v in e.labels.items()},
               **{f"p_{k}": v for k, v in e.times.items()}} for e in incoming]
    conn.execute(insert_done(conn.dialect.name, owner), params)
    return int(conn.execute(_COUNT_IMPORTED, {"p_hashes": [e.key_hash for e in incoming],
                                              "p_owner": owner}).scalar_one())


def overwrite_done(conn: Connection, entry: ImportedEntry, *, token: Any, state: Any,
                   owner: str) -> bool:
    """Overwrite one row under its token and state as read (see OVERWRITE_DONE); False if
    it changed meanwhile."""
    params = {**entry._result(), "p_token": token, "p_state": state, "p_owner": owner}
    return conn.execute(OVERWRITE_DONE, params).rowcount == 1
