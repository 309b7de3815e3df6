"""The row of a listing of entries (ls, show, prune --dry-run), and the statements of ls
and show."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select, true

from ..keys import MAX_CANDIDATE_NAME, MAX_KEY_BYTES, MAX_LABEL, MAX_TIMINGS_BYTES
from .claims import MAX_ERROR_BYTES, db_now
from .columns import bounded
from .entry_filter import EntryFilter
from .schema import entries

__all__ = ["LISTING_COLUMNS", "select_listing", "select_by_prefix"]

_NOW = db_now()

# Stored text as ls, show and prune read it: a column longer than any writer stores comes
# back NULL from the database itself (columns.bounded), so a planted 32 MiB value is
# never read into memory; the readers already treat NULL as absent or invalid.
LISTING_COLUMNS = (
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


def select_listing(env: EntryFilter | None, limit: int) -> Select[Any]:
    cond = env.condition() if env else true()
    return (
        select(*LISTING_COLUMNS)
        .where(cond)
        .order_by(entries.c.updated_at.desc(), entries.c.key_hash)
        .limit(limit)
    )


def select_by_prefix(prefix: str, limit: int = 2) -> Select[Any]:
    """Rows whose hash starts with ``prefix`` (hex only: the caller checks, so LIKE's
    wildcards cannot appear). A range, not LIKE, so the primary key index serves it."""
    upper = prefix + "g"  # 'g' sorts after every hex digit
    return (
        select(*LISTING_COLUMNS, bounded(entries.c.key_json, MAX_KEY_BYTES),
               bounded(entries.c.timings_json, MAX_TIMINGS_BYTES), entries.c.token,
               entries.c.attempts, entries.c.lease_expires_at,
               bounded(entries.c.error, MAX_ERROR_BYTES), _NOW.label("now"))
        .where(entries.c.key_hash >= prefix, entries.c.key_hash < upper)
        .order_by(entries.c.key_hash)
        .limit(limit)
    )
