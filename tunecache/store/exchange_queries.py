"""The statements of export, import and merge: done entries read a page at a time as an
export line carries them, and done entries written by an import or a merge (inserted
where the key is absent, or overwritten under the token read, as the conflict policy
decides); with the transaction bodies that run them (functions of a Connection, which
:meth:`Database.run` calls). Nothing here runs in a compiling job."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Float, Select, bindparam, func, select, true, update

from ..keys import MAX_FAMILY, MAX_KEY_BYTES, MAX_META_BYTES, MAX_TIMINGS_BYTES
from . import gains
from .claims import MAX_STATE, db_now, insert_if_absent
from .columns import bounded
from .entry_filter import EntryFilter
from .schema import entries

__all__ = [
    "select_done_page",
    "count_done",
    "read_for_import",
    "existing_for_import",
    "ImportedEntry",
    "insert_done",
    "insert_done_rows",
    "OVERWRITE_DONE",
    "overwrite_done",
]

_NOW = db_now()

# -- export ------------------------------------------------------------------------------

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


def count_done(env: EntryFilter | None) -> Select[Any]:
    cond = env.condition() if env else true()
    return select(func.count()).where(entries.c.state == "done", cond)


# -- import and merge ----------------------------------------------------------------

# The state compared and the timings a conflict policy compares (`faster`), bounded: a
# state past any real one's length, or timings past their limit, come back NULL (no
# state a policy knows; invalid timings, which lose to any result).
read_for_import = select(
    entries.c.key_hash,
    bounded(entries.c.state, MAX_STATE),
    entries.c.token,
    entries.c.lease_expires_at,
    bounded(entries.c.timings_json, MAX_TIMINGS_BYTES),
    _NOW.label("now"),
).where(entries.c.key_hash.in_(bindparam("p_hashes", expanding=True)))


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
        created_at=func.coalesce(bindparam("p_created_at", type_=Float), _NOW),
        updated_at=func.coalesce(bindparam("p_updated_at", type_=Float), _NOW),
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
        updated_at=_NOW,
        **gains.assignments(),
    )
)


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
