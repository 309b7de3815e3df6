"""The operators' side of compiled graphs (stats, ls, prune, export): which graphs a
command selects (:class:`GraphFilter`), and the statements that count, list and delete
their rows, as functions of a Connection that :class:`~.artifacts.ArtifactStore` runs by
name. Nothing here runs in a compiling job."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    or_,
    select,
    true,
    tuple_,
)

from . import columns
from .artifact_rows import (
    IDENTITY,
    LAST_USE,
    MAX_LABEL_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_TORCH_CHARS,
    NOW,
    ArtifactInfo,
    info_of,
    payload_size,
)
from .entry_filter import EntryFilter
from .schema import artifacts

__all__ = ["GraphFilter", "PAGE", "stats", "info_page", "count", "listing",
           "delete_unchanged", "delete_by_identity", "referenced"]

PAGE = 500  # rows per page of a walk, and per delete transaction


@dataclasses.dataclass(frozen=True)
class GraphFilter:
    """Which compiled graphs an operator command selects: kinds, torch versions (only /
    keep: a graph without a torch label is left alone by keep, as entries are), and a last
    use older than ``older_than`` seconds. Every part given must match."""

    kinds: tuple[str, ...] = ()
    torch_only: tuple[str, ...] = ()
    torch_keep: tuple[str, ...] = ()
    older_than: float | None = None

    @classmethod
    def of_entries(cls, env: EntryFilter | None, older_than: float | None = None
                   ) -> GraphFilter | None:
        """The compiled graphs that the filters of tuning entries select (prune, export),
        or None for none: graphs have a kind and a torch version but no op, device,
        triton version or state, so a filter on one of those matches no graph."""
        if env is not None and (env.ops or env.states or any(
                env.only.get(k) or env.keep.get(k) for k in ("device", "triton"))):
            return None
        if env is None:
            return cls(older_than=older_than)
        return cls(kinds=tuple(env.kinds), torch_only=tuple(env.only.get("torch", ())),
                   torch_keep=tuple(env.keep.get("torch", ())), older_than=older_than)

    def __bool__(self) -> bool:
        return bool(self.kinds or self.torch_only or self.torch_keep
                    or self.older_than is not None)

    def condition(self) -> Any:
        parts: list[Any] = []
        if self.kinds:
            parts.append(artifacts.c.kind.in_(list(self.kinds)))
        if self.torch_only:
            parts.append(artifacts.c.torch_version.in_(list(self.torch_only)))
        if self.torch_keep:
            parts.append(and_(artifacts.c.torch_version.is_not(None),
                              artifacts.c.torch_version.not_in(list(self.torch_keep))))
        if self.older_than is not None:
            parts.append(NOW - bindparam("p_older_than", self.older_than) > LAST_USE)
        return and_(true(), *parts)


def _condition(where: GraphFilter | None) -> Any:
    return where.condition() if where else true()


# -- the statements -----------------------------------------------------------------------

# The digest and torch version bounded in SQL (columns.bounded). Kind and key are the
# primary key the pages are walked by, so they come back whole: PostgreSQL bounds them by
# their types (varchar 32 and 512), SQLite keeps what the writer put.
_INFO_COLUMNS = (artifacts.c.kind, artifacts.c.cache_key,
                 columns.bounded(artifacts.c.digest, 64), artifacts.c.size,
                 columns.bounded(artifacts.c.torch_version, MAX_TORCH_CHARS),
                 artifacts.c.created_at, artifacts.c.last_used_at, artifacts.c.hits)
# payload_size in SQL (SQLite sorts text and blobs above every number, so they fall
# outside too; a fraction is no whole number of bytes).
_SIZE_VALID = and_(artifacts.c.size.between(0, MAX_PAYLOAD_BYTES),
                   artifacts.c.size == func.round(artifacts.c.size))
_MAX_HITS = literal_column(str(1 << 40), BigInteger)
_STATS = select(
    artifacts.c.kind, artifacts.c.torch_version,
    func.count().label("graphs"),
    func.coalesce(func.sum(case((_SIZE_VALID, artifacts.c.size), else_=0)), 0).label("bytes"),
    func.coalesce(func.sum(case((_SIZE_VALID, 0), else_=1)), 0).label("invalid"),
    func.min(artifacts.c.created_at).label("oldest"),
    func.max(LAST_USE).label("last_used"),
    # A hostile count must not overflow SQLite's integer sum and break `stats` for good.
    # The bound is SQL text: bound as a parameter, psycopg casts it to the column's int4,
    # and PostgreSQL refused every stats with "integer out of range".
    func.coalesce(func.sum(case((artifacts.c.hits.between(0, _MAX_HITS), artifacts.c.hits),
                                else_=0)), 0).label("hits"),
    # Entries loaded at least once: against the count, what publishing was worth.
    func.coalesce(func.sum(case((artifacts.c.hits.between(1, _MAX_HITS), 1), else_=0)),
                  0).label("loaded"),
).group_by(artifacts.c.kind, artifacts.c.torch_version)
# A row is deleted by a prune only if it is still the one the prune read (same digest)
# and no read has recorded a use since (a graph just used is not "least recently used").
# A last use that is no finite number (SQLite keeps text or bytes in a REAL column) is no
# recorded use: comparing it would spare a hostile row from every prune.
_USED_SINCE = and_(artifacts.c.last_used_at.is_not(None),
                   artifacts.c.last_used_at.between(-1e300, 1e300),
                   artifacts.c.last_used_at > bindparam("p_last_use"))
_DELETE_IF_UNCHANGED = (
    delete(artifacts)
    .where(IDENTITY, artifacts.c.digest == bindparam("p_digest"),
           or_(artifacts.c.last_used_at.is_(None), ~_USED_SINCE))
    .returning(artifacts.c.digest, artifacts.c.size)
)
_DELETE_BY_IDENTITY = delete(artifacts).where(IDENTITY)
_REFERENCED = select(artifacts.c.digest).where(
    artifacts.c.digest.in_(bindparam("p_digests", expanding=True))).distinct()


# -- transaction bodies -------------------------------------------------------------------

def stats(conn: Connection) -> list[dict[str, Any]]:
    """Count, bytes, oldest creation and last use, loads and entries ever loaded, by
    kind and torch version; ``invalid`` counts rows whose size is impossible (see
    payload_size), left out of bytes."""
    return [{"kind": columns.text(r.kind, MAX_LABEL_CHARS) or columns.clip(r.kind),
             "torch": columns.text(r.torch_version, MAX_LABEL_CHARS),
             "count": int(r.graphs), "bytes": columns.total(r.bytes),
             "invalid": columns.total(r.invalid),
             "oldest_created_at": columns.time(r.oldest),
             "last_used_at": columns.time(r.last_used),
             "hits": columns.total(r.hits), "loaded": columns.total(r.loaded)}
            for r in conn.execute(_STATS).all()]


def info_page(conn: Connection, where: GraphFilter | None,
              after: tuple[str, str]) -> tuple[list[ArtifactInfo], tuple[str, str] | None]:
    """The rows after (kind, key) ``after`` in key order, at most PAGE of them, and where
    the next page starts (None: this was the last)."""
    statement = (select(*_INFO_COLUMNS)
                 .where(_condition(where), tuple_(artifacts.c.kind, artifacts.c.cache_key)
                        > tuple_(bindparam("p_a_kind"), bindparam("p_a_key")))
                 .order_by(artifacts.c.kind, artifacts.c.cache_key)
                 .limit(PAGE))
    page = list(conn.execute(statement, {"p_a_kind": after[0], "p_a_key": after[1]}).all())
    following = (page[-1].kind, page[-1].cache_key) if len(page) == PAGE else None
    return [info_of(r) for r in page], following


def count(conn: Connection, where: GraphFilter | None) -> int:
    statement = select(func.count()).select_from(artifacts).where(_condition(where))
    return int(conn.execute(statement).scalar_one())


def listing(conn: Connection, where: GraphFilter | None, limit: int) -> list[ArtifactInfo]:
    """The most recently used first."""
    statement = (select(*_INFO_COLUMNS).where(_condition(where))
                 .order_by(LAST_USE.desc(), artifacts.c.kind, artifacts.c.cache_key)
                 .limit(limit))
    return [info_of(r) for r in conn.execute(statement).all()]


def delete_unchanged(conn: Connection, infos: Sequence[ArtifactInfo]
                     ) -> list[tuple[str | None, int]]:
    """Delete these rows (each with a digest) if unchanged since read: same digest, no
    use recorded since. (digest, payload bytes) of each row deleted; a digest that is no
    text reads as None."""
    gone = []
    for x in infos:
        r = conn.execute(_DELETE_IF_UNCHANGED, {
            "p_kind": x.kind, "p_key": x.key, "p_digest": x.digest,
            "p_last_use": x.last_use}).first()
        if r is not None:
            gone.append((r.digest if isinstance(r.digest, str) else None,
                         payload_size(r.size) or 0))
    return gone


def delete_by_identity(conn: Connection, infos: Sequence[ArtifactInfo]) -> int:
    """Delete these rows by (kind, key) alone (malformed rows: no digest); rows deleted."""
    return sum(conn.execute(_DELETE_BY_IDENTITY, {"p_kind": x.kind, "p_key": x.key}).rowcount
               for x in infos)


def referenced(conn: Connection, digests: Sequence[str]) -> set[str]:
    """Those of ``digests`` that some row references."""
    return set(conn.execute(_REFERENCED, {"p_digests": list(digests)}).scalars().all())
