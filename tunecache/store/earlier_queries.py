"""The reads that find a key's entry under an earlier library version (after an upgrade of
torch or Triton, a key's hash changes with the versions in its fingerprint; the entry of
the same key under the versions it was recorded with is the best place to start).

Which versions a device has entries of is read once per process (the label columns and
their index, no JSON), then one or a few keys of each version, whose library fields the
caller copies into its own key; the entries of the keys so built are read by hash, as any
key is. A kind whose key holds what the old version computed it from (a Triton config's
holds Inductor's hash of torch's sources) cannot be rebuilt so: its old entries of one op
are read by their labels instead (:func:`entries_of_op`, the stats index). Everything is
bounded in the SQL and returned as untrusted text.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, bindparam, select

from ..keys import MAX_LABEL
from . import columns
from .claims import NEIGHBOUR_KEY_BYTES, NEIGHBOUR_META_BYTES, NEIGHBOUR_TIMINGS_BYTES
from .engine import Database
from .schema import entries

__all__ = ["recorded_versions", "keys_of_version", "entries_of_op"]

# What one sample key may cost: a GEMM key is under 2 KiB (claims.NEIGHBOUR_KEY_BYTES'
# reasoning); a longer one is skipped by the caller.
SAMPLE_KEY_BYTES = 16 * 1024

_VERSIONS = (
    select(columns.bounded(entries.c.torch_version, MAX_LABEL),
           columns.bounded(entries.c.triton_version, MAX_LABEL))
    .where(entries.c.state == "done", entries.c.kind == bindparam("p_kind"),
           entries.c.device == bindparam("p_device"))
    .group_by(entries.c.torch_version, entries.c.triton_version)
    .order_by(entries.c.torch_version.desc(), entries.c.triton_version.desc())
    .limit(bindparam("p_limit"))
)
_KEYS_OF_VERSION = (
    select(columns.bounded(entries.c.key_json, SAMPLE_KEY_BYTES))
    .where(entries.c.state == "done", entries.c.kind == bindparam("p_kind"),
           entries.c.device == bindparam("p_device"),
           entries.c.torch_version == bindparam("p_torch"),
           entries.c.triton_version == bindparam("p_triton"))
    .limit(bindparam("p_limit"))
)

_ENTRIES_OF_OP = (
    select(entries.c.key_hash,
           columns.bounded(entries.c.key_json, NEIGHBOUR_KEY_BYTES),
           columns.bounded(entries.c.timings_json, NEIGHBOUR_TIMINGS_BYTES),
           columns.bounded(entries.c.meta_json, NEIGHBOUR_META_BYTES))
    .where(entries.c.state == "done", entries.c.kind == bindparam("p_kind"),
           entries.c.op == bindparam("p_op"), entries.c.device == bindparam("p_device"),
           entries.c.torch_version == bindparam("p_torch"),
           entries.c.triton_version == bindparam("p_triton"))
    .order_by(entries.c.key_hash)
    .limit(bindparam("p_limit"))
)


def recorded_versions(db: Database, kind: str, device: str,
                      limit: int) -> list[tuple[str | None, str | None]]:
    """The (torch, triton) version labels of up to ``limit`` groups of done entries of
    ``kind`` on ``device``; untrusted text (None: absent or past the label bound)."""

    def work(conn: Connection) -> list[tuple[str | None, str | None]]:
        rows = conn.execute(_VERSIONS, {"p_kind": kind, "p_device": device, "p_limit": limit})
        return [(columns.text(r[0]), columns.text(r[1])) for r in rows]

    return db.run(work)


def keys_of_version(db: Database, kind: str, device: str, versions: Sequence[str],
                    limit: int) -> list[str]:
    """The key JSON of up to ``limit`` done entries of ``kind`` on ``device`` recorded
    under ``versions`` (torch, triton); untrusted text."""
    torch, triton = versions

    def work(conn: Connection) -> list[str]:
        rows = conn.execute(_KEYS_OF_VERSION, {"p_kind": kind, "p_device": device,
                                               "p_torch": torch, "p_triton": triton,
                                               "p_limit": limit})
        return [text for r in rows if (text := columns.text(r[0])) is not None]

    return db.run(work)


def entries_of_op(db: Database, kind: str, op: str, device: str, versions: Sequence[str],
                  limit: int) -> list[tuple[str, str | None, str | None, str | None]]:
    """(key hash, key JSON, timings JSON, meta JSON) of up to ``limit`` done entries of
    ``kind`` and ``op`` on ``device`` recorded under ``versions`` (torch, triton), as
    neighbours are read (the same bounds); untrusted text, unvalidated."""
    torch, triton = versions

    def work(conn: Connection) -> list[tuple[str, str | None, str | None, str | None]]:
        rows = conn.execute(_ENTRIES_OF_OP, {"p_kind": kind, "p_op": op, "p_device": device,
                                             "p_torch": torch, "p_triton": triton,
                                             "p_limit": limit})
        return [(str(r[0]), columns.text(r[1]), columns.text(r[2]), columns.text(r[3]))
                for r in rows]

    return db.run(work)
