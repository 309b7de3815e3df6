"""The statements of `tunecache warm`: pages of the done entries it may rebuild (their
recorded keys, and for ``--exhaustive`` the transferred GEMMs' timings and meta), each
text bounded in SQL to what warm reads."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Select, select, true

from ..keys import MAX_META_BYTES
from .columns import bounded
from .entry_filter import EntryFilter
from .schema import entries

__all__ = ["WARM_KEY_BYTES", "WARM_TIMINGS_BYTES", "select_warm_page", "warm_page",
           "select_transferred_page", "select_user_kernel_page", "user_kernel_page"]

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


def select_user_kernel_page(env: EntryFilter | None, after: str, limit: int) -> Select[Any]:
    """A page of done user-kernel entries, for `warm --user-kernels`: those whose meta
    holds the call that tuned them are re-tuned, the others reported as skipped; the
    caller validates the meta."""
    cond = env.condition() if env else true()
    return (
        select(entries.c.key_hash, bounded(entries.c.key_json, WARM_KEY_BYTES),
               bounded(entries.c.meta_json, MAX_META_BYTES))
        .where(entries.c.state == "done", entries.c.kind == "user_kernel",
               entries.c.key_hash > after, cond)
        .order_by(entries.c.key_hash)
        .limit(limit)
    )


def user_kernel_page(conn: Connection, env: EntryFilter | None, after: str,
                     limit: int) -> list[Any]:
    """A page of :func:`select_user_kernel_page`."""
    return list(conn.execute(select_user_kernel_page(env, after, limit)).all())


def warm_page(conn: Connection, env: EntryFilter | None, after: str, limit: int) -> list[Any]:
    """A page of done entries after key hash ``after`` (see :func:`select_warm_page`)."""
    return list(conn.execute(select_warm_page(env, after, limit)).all())

