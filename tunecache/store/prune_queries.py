"""The statements of `tunecache prune` (entries; compiled graphs' are in
:mod:`tunecache.store.artifact_queries`): what a prune deletes, the walk it deletes in,
entries found invalid, the labels its filters may name, and VACUUM; with the transaction
bodies that run them (functions of a Connection, which :meth:`Database.run` calls).
Nothing here runs in a compiling job.

Deletes are bounded: a prune transaction deletes one batch of rows, a range of the key
order, and the DELETE repeats the selection's conditions in its own WHERE. On PostgreSQL
(READ COMMITTED) a row claimed between the SELECT of a batch and its DELETE is re-checked
against the DELETE's WHERE on its new version (EvalPlanQual), so a claim taken meanwhile
is never deleted; on SQLite the transaction holds the write lock, so nothing changes in
between.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Integer,
    Select,
    and_,
    bindparam,
    column,
    delete,
    false,
    func,
    not_,
    or_,
    select,
    text,
)

from ..keys import MAX_KEY_BYTES, MAX_TIMINGS_BYTES
from .claims import LEASE_PASSED, LEASE_RUNNING, db_now
from .columns import bounded
from .entry_filter import EntryFilter
from .listing import LISTING_COLUMNS
from .schema import artifacts, entries

__all__ = [
    "prune_condition",
    "select_pruned",
    "select_pruned_among",
    "count_pruned",
    "SQLITE_ROWID",
    "prune_walk_column",
    "select_prune_batch",
    "select_walk_end",
    "delete_pruned_range",
    "sqlite_prune_pragmas",
    "prune_batch",
    "select_done_timings_page",
    "delete_invalid",
    "delete_invalid_done",
    "stored_labels",
    "SQLITE_VACUUM",
    "PG_VACUUM_ENTRIES",
    "vacuum",
]

_NOW = db_now()

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
        entry_parts.append(_NOW - bindparam("p_older_than", older_than) > _LAST_USE)
    if env:
        entry_parts.append(env.condition())
    if entry_parts:
        classes.append(and_(entries.c.state.in_(["done", "failed"]), *entry_parts))
    if not classes:
        return false()
    # Belt and braces: whatever the classes say, a claim whose lease runs is someone's work.
    return and_(or_(*classes), not_(and_(entries.c.state == "claimed", LEASE_RUNNING)))


def select_pruned(condition: ColumnElement[bool], after: str, limit: int) -> Select[Any]:
    """A page (keyset by key_hash) of what a prune would delete: for --dry-run listings."""
    return (
        select(*LISTING_COLUMNS)
        .where(condition, entries.c.key_hash > after)
        .order_by(entries.c.key_hash)
        .limit(limit)
    )


def select_pruned_among(condition: ColumnElement[bool], hashes: Sequence[str]) -> Select[Any]:
    """Which of ``hashes`` (at most a few hundred) a prune's ``condition`` takes."""
    return select(entries.c.key_hash).where(condition, entries.c.key_hash.in_(list(hashes)))


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


def prune_batch(conn: Connection, condition: ColumnElement[bool], walk: ColumnElement[Any],
                delete_range: Any, size: int, after: Any, top: Any) -> tuple[Any, int, int]:
    """Delete the next batch of at most ``size`` rows matching ``condition`` after
    ``after`` (up to ``top``) in the walk's order: (its last position or None when there
    is none, rows deleted, rows selected)."""
    sqlite = conn.dialect.name == "sqlite"
    with sqlite_prune_pragmas(conn) if sqlite else nullcontext():
        select_batch = select_prune_batch(condition, size, walk)
        ends = conn.execute(select_batch, {"p_after": after, "p_top": top}).scalars().all()
        if not ends:
            return None, 0, 0
        result = conn.execute(delete_range, {"p_after": after, "p_last": ends[-1]})
        return ends[-1], result.rowcount, len(ends)


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


def delete_invalid_done(conn: Connection, hashes: Sequence[str]) -> int:
    """Delete these done entries (found invalid); rows deleted."""
    return conn.execute(delete_invalid, {"p_hashes": list(hashes)}).rowcount


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


SQLITE_VACUUM = text("VACUUM")
# Plain VACUUM (not FULL): it marks dead rows reusable without locking out readers or
# writers. VACUUM FULL would shrink the files but takes an ACCESS EXCLUSIVE lock.
PG_VACUUM_ENTRIES = text("VACUUM (ANALYZE) tunecache_entries")


def vacuum(conn: Connection) -> None:
    """VACUUM (SQLite: the whole file; PostgreSQL: plain VACUUM of the entries table).

    It cannot run inside a transaction: the caller runs it as a read (autocommit on both
    engines)."""
    sqlite = conn.dialect.name == "sqlite"
    conn.execute(SQLITE_VACUUM if sqlite else PG_VACUUM_ENTRIES)
