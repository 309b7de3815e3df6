"""The statements of `tunecache stats`: entries by state, environment and op, usage
totals, claims in flight, failed keys, what tuning bought (sums of the gain columns,
:mod:`tunecache.store.gains`), and the database's size; with the transaction bodies that
run them (functions of a Connection, which :meth:`Database.run` calls). Nothing here
runs in a compiling job."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    Select,
    and_,
    bindparam,
    case,
    func,
    not_,
    null,
    or_,
    select,
    text,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from .. import stored_json
from ..keys import MAX_LABEL, MAX_META_BYTES, MAX_TIMINGS_BYTES
from . import columns, gains
from .claims import LEASE_PASSED, LEASE_RUNNING, MAX_ERROR_BYTES, db_now
from .schema import entries, usage

__all__ = [
    "STATS_GROUPS",
    "USAGE_TOTALS",
    "USAGE_INVALID",
    "CLAIMS_LIVE",
    "CLAIMS_EXPIRED_COUNT",
    "FAILED_KEYS",
    "GAINS_GROUPS",
    "PG_DATABASE_SIZE",
    "SQLITE_PAGE_COUNT",
    "SQLITE_FREELIST_COUNT",
    "SQLITE_PAGE_SIZE",
    "stats_groups",
    "usage_totals",
    "usage_by_day",
    "USAGE_BY_DAY",
    "USAGE_FIELDS",
    "live_claims",
    "expired_claims_count",
    "failed_keys",
    "top_gains",
    "select_gains_page",
    "sqlite_size",
    "pg_database_size",
]

_NOW = db_now()

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

# The processes' reports (tunecache_usage), each row summed only if every count and time
# in it is one a writer stores, as above: two planted rows with hits of 2^62 overflowed
# SQLite's SUM and two of 1e308 seconds PostgreSQL's, and `stats` failed until they were
# deleted. A row out of bounds is counted apart (``invalid``), never summed.
_USAGE_COUNTS = (usage.c.hits, usage.c.tuned, usage.c.peer, usage.c.local)
_USAGE_TIMES = (usage.c.seconds_saved, usage.c.seconds_tuning, usage.c.recorded_at)
_USAGE_VALID = and_(*(and_(c >= 0, c <= gains.MAX_COUNT) for c in _USAGE_COUNTS),
                    *(and_(c >= 0, c <= stored_json.MAX_NUMBER) for c in _USAGE_TIMES))
# Within the window: reports recorded at most p_since seconds ago (the database's clock,
# which wrote recorded_at).
_USAGE_SHOWN = and_(_USAGE_VALID, usage.c.recorded_at >= _NOW - bindparam("p_since"))
USAGE_FIELDS = ("hits", "tuned", "peer", "local", "seconds_saved", "seconds_tuning")


# The reports of the window, filtered once per row (a CASE in each sum tested every bound
# once per column: 0.3 s on 100,000 reports against 0.05 s), and the invalid ones counted
# in a scan of their own.
USAGE_TOTALS = select(
    func.count().label("reports"),
    *(func.coalesce(func.sum(c), 0).label(c.name)
      for c in (*_USAGE_COUNTS, usage.c.seconds_saved, usage.c.seconds_tuning)),
    func.min(usage.c.recorded_at).label("first"),
    func.max(usage.c.recorded_at).label("last"),
).where(_USAGE_SHOWN)
USAGE_INVALID = select(func.count()).where(not_(_USAGE_VALID))


class utc_day(FunctionElement[int]):
    """The UTC day (days since the epoch) of a time in seconds that is not negative."""

    type = Integer()
    inherit_cache = True


@compiles(utc_day)
def _utc_day_sqlite(element: utc_day, compiler: Any, **kw: Any) -> str:
    # SQLite has no floor() unless built with its math functions; a cast truncates, which
    # for a time that is not negative is the floor.
    return f"CAST(({compiler.process(element.clauses, **kw)}) / 86400 AS INTEGER)"


@compiles(utc_day, "postgresql")
def _utc_day_postgresql(element: utc_day, compiler: Any, **kw: Any) -> str:
    return f"floor(({compiler.process(element.clauses, **kw)}) / 86400)::bigint"


_DAY = utc_day(usage.c.recorded_at)
# The reports per UTC day, newest first, at most p_days of them.
USAGE_BY_DAY = (
    select(_DAY.label("day"), func.count().label("reports"),
           *(func.sum(c).label(c.name)
             for c in (*_USAGE_COUNTS, usage.c.seconds_saved, usage.c.seconds_tuning)))
    .where(_USAGE_SHOWN)
    .group_by(_DAY)
    .order_by(_DAY.desc())
    .limit(bindparam("p_days"))
)

_CLAIM_COLUMNS = (
    columns.bounded(entries.c.key_hash, 64),
    columns.bounded(entries.c.op, MAX_LABEL),
    columns.bounded(entries.c.owner, MAX_LABEL),
    entries.c.token,
    entries.c.attempts,
    entries.c.updated_at,
    entries.c.lease_expires_at,
    _NOW.label("now"),
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


def stats_groups(conn: Connection) -> list[Any]:
    return list(conn.execute(STATS_GROUPS).all())


def usage_totals(conn: Connection, since: float) -> tuple[Any, int]:
    """The processes' reports of the last ``since`` seconds, summed within bounds, and
    the count of reports out of them (of any time)."""
    return (conn.execute(USAGE_TOTALS, {"p_since": since}).one(),
            int(conn.execute(USAGE_INVALID).scalar_one()))


def usage_by_day(conn: Connection, since: float, days: int) -> list[Any]:
    """The last ``days`` UTC days with reports in the last ``since`` seconds, newest first."""
    return list(conn.execute(USAGE_BY_DAY, {"p_since": since, "p_days": days}).all())


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
