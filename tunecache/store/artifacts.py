"""Compiled graphs in the shared database: Inductor's FX graph and AOTAutograd cache
entries, published once per cluster and read by every job.

First publish wins: ``put`` inserts the row if (kind, key) is absent and never rewrites
it, so all ranks that compile one graph at once store it once. The one exception is
``replace``: a publisher that found the row unverifiable (signed with a retired key,
planted, damaged) swaps it for its own, only if the row is still the one it read. The
store neither signs nor verifies (the core does, tunecache.core); it keeps the signature
beside the bytes and checks only that the bytes are the ones published (their sha256).

SQLite: the payload is a content-addressed file beside the database
(:mod:`tunecache.store.blobs`), written before the row's transaction, under the blob's
filelock, which is held until the row is committed; the transaction itself is one short
INSERT. PostgreSQL: the payload is a bytea column (no write lock to share: a publish
blocks nobody's claim).

Everything read back is untrusted: a row of wrong-typed columns, a blob that is missing,
short or altered, is None plus one warning, never an exception.

The operator statements (stats, ls, prune, export) are here too, beside the table they
read; tunecache.ops calls them by name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import re
from typing import Any, Iterator, Mapping, Sequence

from filelock import Timeout
from sqlalchemy import (
    Connection,
    Float,
    and_,
    bindparam,
    case,
    delete,
    exc,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import NullType

from ..errors import ReadonlyModeError, StoreError, StoreTimeoutError
from .admin import EntryFilter
from .blobs import DIGEST, BlobDir, blob_dir_for
from .engine import Database
from .schema import artifacts
from .store import db_now

__all__ = [
    "Artifact",
    "ArtifactInfo",
    "ArtifactStore",
    "GraphFilter",
    "ARTIFACT_KINDS",
    "MAX_KEY_CHARS",
    "MAX_SIGNATURE_BYTES",
    "MAX_PAYLOAD_BYTES",
    "TOUCH_SECONDS",
    "validate_identity",
]

logger = logging.getLogger("tunecache")

# The kinds Inductor has today; any name of this shape is stored (a later tunecache may
# share another of Inductor's caches).
ARTIFACT_KINDS = ("fxgraph", "autograd")
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_KEY_CHARS = 512
MAX_SIGNATURE_BYTES = 4096
MAX_TORCH_CHARS = 256
# PostgreSQL's bytea holds at most 1 GB; an FX graph entry of a large model is tens of MB.
MAX_PAYLOAD_BYTES = 512 * 2**20
# A read records its use only when the stored one is older than this: prune's LRU needs
# days, not seconds, and a write per read would take SQLite's write lock on every hit.
TOUCH_SECONDS = 3600.0

_NOW = db_now()


def validate_identity(kind: Any, key: Any) -> str | None:
    """Why (kind, key) cannot name an artifact, or None."""
    if not isinstance(kind, str) or not _KIND.match(kind):
        return f"kind {str(kind)[:40]!r} is not a lowercase name of at most 32 characters"
    if not isinstance(key, str) or not key:
        return "key is not a non-empty string"
    if len(key) > MAX_KEY_CHARS:
        return f"key has {len(key)} characters, more than {MAX_KEY_CHARS}"
    return None


def _validate_put(kind: Any, key: Any, payload: Any, signature: Any,
                  torch_version: Any) -> None:
    why = validate_identity(kind, key)
    if why is None and not isinstance(payload, (bytes, bytearray, memoryview)):
        why = "payload is not bytes"
    elif why is None and len(payload) > MAX_PAYLOAD_BYTES:
        why = f"payload of {len(payload)} bytes is over {MAX_PAYLOAD_BYTES}"
    elif why is None and (not isinstance(signature, (bytes, bytearray))
                          or not 0 < len(signature) <= MAX_SIGNATURE_BYTES):
        why = f"signature is not 1 to {MAX_SIGNATURE_BYTES} bytes"
    elif why is None and (not isinstance(torch_version, str)
                          or len(torch_version) > MAX_TORCH_CHARS):
        why = f"torch_version is not a string of at most {MAX_TORCH_CHARS} characters"
    if why is not None:
        raise ValueError(f"tunecache artifact not stored: {why}")


@dataclasses.dataclass(frozen=True)
class Artifact:
    kind: str  # "fxgraph" or "autograd" (Inductor's FX graph / AOTAutograd cache)
    key: str  # Inductor's own cache key string (<= 512 chars)
    digest: str  # sha256 hex of payload, computed by the store on put
    signature: bytes  # opaque to the store (made and checked by the core)
    payload: bytes  # compressed bytes exactly as given to put()
    torch_version: str
    created_at: float


@dataclasses.dataclass(frozen=True)
class ArtifactInfo:
    """A row without its payload (ls, prune, export). Columns of the wrong type read as
    None (SQLite keeps whatever a writer put in a column)."""

    kind: str
    key: str
    digest: str | None
    size: int | None
    torch_version: str | None
    created_at: float | None
    last_used_at: float | None
    hits: int | None = None  # loads recorded by jobs

    @property
    def last_use(self) -> float:
        return self.last_used_at or self.created_at or 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _text(value: Any, limit: int = 1 << 20) -> str | None:
    return value if isinstance(value, str) and len(value) <= limit else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _size(value: Any) -> int | None:
    """A payload size read from a row, or None: no whole number from 0 to
    MAX_PAYLOAD_BYTES (what put and replace accept) was written by a tunecache. A hostile
    size is never summed: -10^18 hid every other graph from a byte budget, and 2^63-1
    overflowed SQLite's sum for good."""
    size = _int(value)
    return size if size is not None and 0 <= size <= MAX_PAYLOAD_BYTES else None


def _time(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _total(value: Any) -> int:
    """A SUM read back: PostgreSQL's sum of bigint is numeric (a Decimal); SQLite's is
    whatever the column held (text in a hostile row sums as 0)."""
    try:
        total = float(value)
    except (TypeError, ValueError):
        return 0
    return int(total) if math.isfinite(total) else 0


def _bytes(value: Any) -> bytes | None:
    if isinstance(value, memoryview):
        return value.tobytes()
    return bytes(value) if isinstance(value, (bytes, bytearray)) else None


def _clip(value: Any, n: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= n else text[: n - 1] + "\u2026"


# -- the statements -----------------------------------------------------------------------

_IDENTITY = and_(artifacts.c.kind == bindparam("p_kind"),
                 artifacts.c.cache_key == bindparam("p_key"))
_META = (artifacts.c.digest, artifacts.c.signature, artifacts.c.size, artifacts.c.torch_version,
         artifacts.c.created_at, artifacts.c.last_used_at)
# PostgreSQL: the payload's length is read first (octet_length reads the stored value's
# header, not the value), and the bytes only come back when they are as many as the row
# says and within MAX_PAYLOAD_BYTES: a row that claims gigabytes costs no read of them.
_PG_PAYLOAD_BYTES = func.octet_length(artifacts.c.payload)
_PG_PAYLOAD = case(
    (and_(_PG_PAYLOAD_BYTES == artifacts.c.size,
          artifacts.c.size <= literal_column(str(MAX_PAYLOAD_BYTES))), artifacts.c.payload),
    else_=null())
_READ = {
    "sqlite": select(*_META, _NOW.label("now")).where(_IDENTITY),
    "postgresql": select(*_META, _PG_PAYLOAD_BYTES.label("payload_bytes"),
                         _PG_PAYLOAD.label("payload"), _NOW.label("now")).where(_IDENTITY),
}
# The PostgreSQL read, as psycopg runs it (compiled once from the statement above): in
# binary format, a bytea comes as its bytes; in text format (all SQLAlchemy asks for) as
# hex, twice its size, to be decoded. 10 MB on this 2-core VM: 0.03 s against 0.20 s.
_PG_READ_SQL = str(_READ["postgresql"].compile(dialect=postgresql.psycopg.dialect()))


def _pg_read_binary(conn: Connection, params: dict[str, Any]) -> Any:
    """The row of _READ["postgresql"], read in binary format on the driver's connection.
    A driver error is wrapped as SQLAlchemy would have, so that Database.run retries
    and translates it as it does every other."""
    import psycopg
    from psycopg.rows import namedtuple_row

    driver = conn.connection.driver_connection
    try:
        with driver.cursor(binary=True, row_factory=namedtuple_row) as cur:
            cur.execute(_PG_READ_SQL, params)
            return cur.fetchone()
    except psycopg.Error as e:
        raise exc.DBAPIError.instance(_PG_READ_SQL, params, e, psycopg.Error,
                                      dialect=conn.dialect) from e


_EXISTS = select(artifacts.c.digest, artifacts.c.size).where(_IDENTITY)
_TOUCH = (
    update(artifacts)
    .where(_IDENTITY, or_(artifacts.c.last_used_at.is_(None),
                          artifacts.c.last_used_at < _NOW - TOUCH_SECONDS))
    .values(last_used_at=_NOW)
)


def _insert_statement(dialect: str) -> Any:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        insert(artifacts)
        .values(kind=bindparam("p_kind"), cache_key=bindparam("p_key"),
                digest=bindparam("p_digest"), signature=bindparam("p_signature"),
                size=bindparam("p_size"), torch_version=bindparam("p_torch_version"),
                created_at=_NOW, last_used_at=_NOW, payload=bindparam("p_payload"))
        .on_conflict_do_nothing(index_elements=["kind", "cache_key"])
        .returning(artifacts.c.kind)
    )


_INSERT = {d: _insert_statement(d) for d in ("sqlite", "postgresql")}
# replace's compare-and-swap: the row is rewritten only if its digest and signature are
# still the ones the replacer read and refused. Compared untyped and null-safe (IS / IS NOT
# DISTINCT FROM): a hostile SQLite row may hold NULL, text or a number in either column,
# and must still be replaceable.
_ROW_VERSION = select(artifacts.c.digest, artifacts.c.signature).where(_IDENTITY)
_UNCHANGED = and_(
    type_coerce(artifacts.c.digest, NullType()).is_not_distinct_from(
        bindparam("p_old_digest", type_=NullType())),
    type_coerce(artifacts.c.signature, NullType()).is_not_distinct_from(
        bindparam("p_old_signature", type_=NullType())),
)
_REPLACE = (
    update(artifacts)
    .where(_IDENTITY, _UNCHANGED)
    .values(digest=bindparam("p_digest"), signature=bindparam("p_signature"),
            size=bindparam("p_size"), torch_version=bindparam("p_torch_version"),
            created_at=_NOW, last_used_at=_NOW, payload=bindparam("p_payload"))
    .returning(artifacts.c.kind)
)
_REFERENCED = select(artifacts.c.digest).where(
    artifacts.c.digest.in_(bindparam("p_digests", expanding=True))).distinct()
_INFO_COLUMNS = (artifacts.c.kind, artifacts.c.cache_key, artifacts.c.digest, artifacts.c.size,
                 artifacts.c.torch_version, artifacts.c.created_at, artifacts.c.last_used_at,
                 artifacts.c.hits)
_LAST_USE = func.coalesce(artifacts.c.last_used_at, artifacts.c.created_at)
# _size in SQL (SQLite sorts text and blobs above every number, so they fall outside too;
# a fraction is no whole number of bytes).
_SIZE_VALID = and_(artifacts.c.size.between(0, MAX_PAYLOAD_BYTES),
                   artifacts.c.size == func.round(artifacts.c.size))
_STATS = select(
    artifacts.c.kind, artifacts.c.torch_version,
    func.count().label("count"),
    func.coalesce(func.sum(case((_SIZE_VALID, artifacts.c.size), else_=0)), 0).label("bytes"),
    func.coalesce(func.sum(case((_SIZE_VALID, 0), else_=1)), 0).label("invalid"),
    func.min(artifacts.c.created_at).label("oldest"),
    func.max(_LAST_USE).label("last_used"),
    # A hostile count must not overflow SQLite's integer sum and break `stats` for good.
    func.coalesce(func.sum(case((artifacts.c.hits.between(0, 2**31 - 1), artifacts.c.hits),
                                else_=0)), 0).label("hits"),
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
    .where(_IDENTITY, artifacts.c.digest == bindparam("p_digest"),
           or_(artifacts.c.last_used_at.is_(None), ~_USED_SINCE))
    .returning(artifacts.c.digest, artifacts.c.size)
)
_DELETE_BY_IDENTITY = delete(artifacts).where(_IDENTITY)
# A job's loads of one graph, batched: the count added, the last use moved to the time of
# the last load (never back: jobs flush in any order).
_RECORD_USES = (
    update(artifacts)
    .where(_IDENTITY)
    .values(hits=artifacts.c.hits + bindparam("p_n"),
            last_used_at=case((or_(artifacts.c.last_used_at.is_(None),
                                   artifacts.c.last_used_at < bindparam("p_at", type_=Float)),
                               bindparam("p_at", type_=Float)),
                              else_=artifacts.c.last_used_at))
)
_PAGE = 500


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
                   ) -> "GraphFilter | None":
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
            parts.append(_LAST_USE < _NOW - bindparam("p_older_than", self.older_than))
        return and_(true(), *parts)


class ArtifactStore:
    """Compiled graphs over the same :class:`Database` the tuning :class:`Store` uses."""

    def __init__(self, db: Database) -> None:
        self.db = db
        path = db.sqlite_path
        self.blobs: BlobDir | None = (BlobDir(blob_dir_for(path), db.lock_timeout)
                                      if db.is_sqlite and path else None)

    # -- the job's side -------------------------------------------------------------------

    def get(self, kind: str, key: str, *, touch: bool = True) -> Artifact | None:
        """The artifact, or None if absent or unreadable (one warning: a row or blob that
        is not what was published). With ``touch``, at most once an hour per artifact, a
        read records its use (a short write, skipped on a readonly database); a job's
        loads are counted instead (:meth:`record_uses`)."""
        if validate_identity(kind, key) is not None:
            return None  # nothing can be stored under it
        found, row = self._fetch(kind, key)
        if found is None or isinstance(found, str):
            if found is not None:
                logger.warning("tunecache: compiled graph %s %s: %s; ignored", kind,
                               _clip(key, 40), found)
            return None
        last_used = _time(row.last_used_at)
        if touch and not self.db.readonly and (last_used is None
                                     or last_used < float(row.now) - TOUCH_SECONDS):
            self._touch({"p_kind": kind, "p_key": key})
        return found

    def inspect(self, kind: str, key: str) -> Artifact | str | None:
        """Like :meth:`get`, without a warning or a recorded use (export, ls --verify):
        the artifact, why it is unreadable, or None if absent."""
        if validate_identity(kind, key) is not None:
            return None
        return self._fetch(kind, key)[0]

    def examine(self, kind: str, key: str) -> tuple[Artifact | str | None, Any, Any]:
        """For a publisher whose put found the row there: the artifact (or why it is
        unreadable, or None if gone since), with the row's digest and signature exactly as
        read, which :meth:`replace` takes to swap only that row. No warning, no recorded
        use."""
        if validate_identity(kind, key) is not None:
            return None, None, None
        found, row = self._fetch(kind, key)
        if row is None:
            return None, None, None
        return found, row.digest, row.signature

    def _fetch(self, kind: str, key: str) -> tuple[Artifact | str | None, Any]:
        params = {"p_kind": kind, "p_key": key}
        if self.db.dialect == "postgresql":
            row = self.db.run(lambda c: _pg_read_binary(c, params))
        else:
            row = self.db.run(lambda c: c.execute(_READ["sqlite"], params).first())
        if row is None:
            return None, None
        digest = _text(row.digest, 64)
        size = _size(row.size)
        signature = _bytes(row.signature)
        created_at = _time(row.created_at)
        torch_version = _text(row.torch_version, MAX_TORCH_CHARS)
        if digest is None or not DIGEST.match(digest) or size is None or size < 0 \
                or signature is None or created_at is None or torch_version is None:
            return "its database row is malformed", row
        if size > MAX_PAYLOAD_BYTES:  # never written by a store: refused before any read
            return (f"its database row claims {size} bytes, more than the store's limit of "
                    f"{MAX_PAYLOAD_BYTES}"), row
        if self.blobs is not None:
            data: bytes | str = self.blobs.read(digest, size)
        else:
            raw = _bytes(row.payload)
            stored = _int(row.payload_bytes)
            if stored is None:
                data = "its payload is missing"
            elif stored != size:
                data = f"its payload has {stored} bytes, not {size}"
            elif raw is None or len(raw) != size:
                data = "its payload is missing"
            elif hashlib.sha256(raw).hexdigest() != digest:
                data = "its payload does not match its digest (corrupted)"
            else:
                data = raw
        if isinstance(data, str):
            return data, row
        return Artifact(kind, key, digest, signature, data, torch_version, created_at), row

    def record_uses(self, uses: Mapping[tuple[str, str], tuple[int, float]]) -> None:
        """Add loads to graphs' counts: (kind, key) -> (loads, time of the last), in one
        transaction. A graph pruned meanwhile is skipped."""
        params = [{"p_kind": kind, "p_key": key, "p_n": n, "p_at": at}
                  for (kind, key), (n, at) in sorted(uses.items())]
        if params:
            self.db.run(lambda c: c.execute(_RECORD_USES, params), write=True)

    def _touch(self, params: dict[str, Any]) -> None:
        try:
            self.db.run(lambda c: c.execute(_TOUCH, params), write=True)
        except StoreError as e:  # bookkeeping: the read has succeeded either way
            logger.debug("tunecache: last use of a compiled graph not recorded: %s", e)

    def put(self, kind: str, key: str, payload: bytes, signature: bytes,
            torch_version: str) -> bool:
        """Publish; True when this call published, False when (kind, key) was there.

        Raises ValueError for arguments that cannot be stored (key over 512 characters,
        payload over MAX_PAYLOAD_BYTES, ...), ReadonlyModeError on a readonly database,
        and the store's errors (tunecache.errors.StoreError) for the database's.
        """
        payload, digest, params = self._row_to_write(
            "publishing", kind, key, payload, signature, torch_version)
        # One graph is published once per cluster: when the row is there, nothing is
        # written (ranks that compiled it too read this and return).
        existing = self.db.run(lambda c: c.execute(_EXISTS, params).first())
        if existing is not None:
            self._heal(existing, payload, digest)
            return False
        if self.blobs is None:
            params["p_payload"] = payload
            return self._insert(params)
        try:
            with self.blobs.publishing(kind, key):
                # Ranks that waited for the key's lock: the first one's row is there now.
                if self.db.run(lambda c: c.execute(_EXISTS, params).first()) is not None:
                    return False
                with self.blobs.locked(digest) as path:
                    if not self.blobs.intact(path, digest, len(payload)):
                        self.blobs.write(path, payload)
                    # Still under the blob's lock: a prune deletes a blob only under it,
                    # after seeing no row, so this blob cannot vanish before its row
                    # exists.
                    return self._insert(params)
        except (Timeout, OSError) as e:
            raise self._blob_error(e) from e

    def _row_to_write(self, doing: str, kind: str, key: str, payload: bytes,
                      signature: bytes, torch_version: str
                      ) -> tuple[bytes, str, dict[str, Any]]:
        """Validated arguments of put/replace: (payload, its digest, statement params)."""
        _validate_put(kind, key, payload, signature, torch_version)
        if self.db.readonly:
            # Before any blob is written: a readonly job leaves nothing behind.
            raise ReadonlyModeError(self.db.display_url, f"{doing} a compiled graph")
        payload = bytes(payload)
        digest = hashlib.sha256(payload).hexdigest()
        params = {"p_kind": kind, "p_key": key, "p_digest": digest,
                  "p_signature": bytes(signature), "p_size": len(payload),
                  "p_torch_version": torch_version, "p_payload": None}
        return payload, digest, params

    def replace(self, kind: str, key: str, expected_digest: Any, expected_signature: Any,
                payload: bytes, signature: bytes, torch_version: str) -> bool:
        """Rewrite the row of (kind, key) with this publish if it still holds
        ``expected_digest`` and ``expected_signature`` (what :meth:`examine` read): True
        when this call replaced it; False when the row changed or vanished meanwhile
        (another publisher replaced it, a prune deleted it), and then nothing is written.

        Only for a row the caller found unverifiable: the store cannot tell, the core
        can. The swap is one UPDATE, so two replacers of one bad row leave exactly one of
        theirs, and a row one of them has just written is never clobbered by the other.
        On SQLite the new blob is written before the transaction, as put writes it; the
        old blob is deleted (under its lock) unless another row uses it. Raises as put.
        """
        payload, digest, params = self._row_to_write(
            "replacing", kind, key, payload, signature, torch_version)
        params.update(p_old_digest=expected_digest, p_old_signature=expected_signature)
        if self.blobs is None:
            params["p_payload"] = payload
            return self._swap(params)
        try:
            with self.blobs.publishing(kind, key):
                # Replacers that waited for the key's lock: the first one has swapped the
                # row, and the others write no blob.
                if not self._unchanged(params):
                    return False
                with self.blobs.locked(digest) as path:
                    if not self.blobs.intact(path, digest, len(payload)):
                        self.blobs.write(path, payload)
                    # Under the blob's lock until the row names it, as in put.
                    replaced = self._swap(params)
                if replaced and isinstance(expected_digest, str) and expected_digest != digest \
                        and DIGEST.match(expected_digest):
                    self._drop_blob(expected_digest)
                return replaced
        except (Timeout, OSError) as e:
            raise self._blob_error(e) from e

    def _blob_error(self, e: Exception) -> StoreError:
        """Blob-file trouble as the store's own error."""
        if isinstance(e, Timeout):
            # A publisher of this key (or a prune of this blob) held its lock for the
            # whole lock timeout: frozen or on a stalled filesystem. Same as a locked
            # database for the caller.
            return StoreTimeoutError(self.db.display_url, f"lock {e.lock_file} still held "
                                     f"after {self.db.lock_timeout:g}s")
        assert self.blobs is not None
        detail = e.strerror if isinstance(e, OSError) and e.strerror else e
        return StoreError(self.db.display_url,
                          f"compiled graph blob in {self.blobs.root}: {detail}")

    def _drop_blob(self, digest: str) -> None:
        """As prune does: the replaced row's blob goes unless a row still uses it (a
        failure leaves an orphan that prune sweeps; the replace itself is done)."""
        assert self.blobs is not None
        try:
            self.blobs.delete_unless(digest, lambda: bool(self.referenced([digest])))
        except (OSError, Timeout, StoreError) as e:
            logger.debug("tunecache: replaced blob %s not deleted: %s", digest, e)

    def _unchanged(self, params: dict[str, Any]) -> bool:
        row = self.db.run(lambda c: c.execute(_ROW_VERSION, params).first())
        return row is not None and row.digest == params["p_old_digest"] \
            and row.signature == params["p_old_signature"]

    def _swap(self, params: dict[str, Any]) -> bool:
        return self.db.run(lambda c: c.execute(_REPLACE, params).first() is not None,
                           write=True)

    def _insert(self, params: dict[str, Any]) -> bool:
        statement = _INSERT[self.db.dialect]
        return self.db.run(lambda c: c.execute(statement, params).first() is not None,
                           write=True)

    def _heal(self, existing: Any, payload: bytes, digest: str) -> None:
        """A publisher of the same bytes puts back a blob that went missing or bad (a
        first-wins row is never rewritten, so nothing else ever would)."""
        if self.blobs is None or existing.digest != digest:
            return
        path = self.blobs.path(digest)
        try:
            healthy = os.stat(path).st_size == _int(existing.size)
        except OSError:
            healthy = False
        if healthy:
            return
        try:
            with self.blobs.locked(digest) as path:
                if not self.blobs.intact(path, digest, len(payload)):
                    logger.warning("tunecache: blob %s was missing or damaged; rewritten",
                                   path)
                    self.blobs.write(path, payload)
        except (OSError, Timeout) as e:  # a repair; the publish itself was not ours
            logger.debug("tunecache: blob %s not repaired: %s", path, e)

    # -- the operators' side ------------------------------------------------------------

    def stats(self) -> list[dict[str, Any]]:
        """Count, bytes, oldest creation and last use, by kind and torch version;
        ``invalid`` counts rows whose size is impossible (see _size), left out of bytes."""
        rows = self.db.run(lambda c: list(c.execute(_STATS).all()))
        return [{"kind": _text(r.kind) or _clip(r.kind), "torch": _text(r.torch_version),
                 "count": int(r.count), "bytes": _total(r.bytes),
                 "invalid": _total(r.invalid),
                 "oldest_created_at": _time(r.oldest), "last_used_at": _time(r.last_used),
                 "hits": _total(r.hits)}
                for r in rows]

    def infos(self, where: GraphFilter | None = None) -> Iterator[list[ArtifactInfo]]:
        """Every row's metadata (never the payload), page by page in key order."""
        cond = where.condition() if where else true()
        after: tuple[str, str] = ("", "")
        while True:
            statement = (select(*_INFO_COLUMNS)
                         .where(cond, tuple_(artifacts.c.kind, artifacts.c.cache_key)
                                > tuple_(bindparam("p_a_kind"), bindparam("p_a_key")))
                         .order_by(artifacts.c.kind, artifacts.c.cache_key)
                         .limit(_PAGE))
            page = self.db.run(lambda c: list(c.execute(
                statement, {"p_a_kind": after[0], "p_a_key": after[1]}).all()))
            if not page:
                return
            yield [_info(r) for r in page]
            if len(page) < _PAGE:
                return
            after = (page[-1].kind, page[-1].cache_key)

    def count(self, where: GraphFilter | None = None) -> int:
        cond = where.condition() if where else true()
        statement = select(func.count()).select_from(artifacts).where(cond)
        return int(self.db.run(lambda c: c.execute(statement).scalar_one()))

    def exists(self, kind: str, key: str) -> bool:
        params = {"p_kind": kind, "p_key": key}
        return self.db.run(lambda c: c.execute(_EXISTS, params).first()) is not None

    def listing(self, where: GraphFilter | None, limit: int) -> list[ArtifactInfo]:
        """The most recently used first."""
        cond = where.condition() if where else true()
        statement = (select(*_INFO_COLUMNS).where(cond)
                     .order_by(_LAST_USE.desc(), artifacts.c.kind, artifacts.c.cache_key)
                     .limit(limit))
        return [_info(r) for r in self.db.run(lambda c: list(c.execute(statement).all()))]

    def delete(self, infos: Sequence[ArtifactInfo]) -> tuple[int, int]:
        """Delete these rows if unchanged since read (same digest, no use recorded
        since), then their blobs that no row references. (rows, payload bytes) deleted."""
        deleted = freed = 0
        digests: set[str] = set()
        for i in range(0, len(infos), _PAGE):
            chunk = [x for x in infos[i:i + _PAGE] if x.digest is not None]

            def work(conn: Connection) -> list[Any]:
                gone = []
                for x in chunk:
                    r = conn.execute(_DELETE_IF_UNCHANGED, {
                        "p_kind": x.kind, "p_key": x.key, "p_digest": x.digest,
                        "p_last_use": x.last_use}).first()
                    if r is not None:
                        gone.append(r)
                return gone

            for r in self.db.run(work, write=True):
                deleted += 1
                freed += _size(r.size) or 0
                if isinstance(r.digest, str):
                    digests.add(r.digest)
        # Malformed rows (no digest) are deleted by identity alone.
        bad = [x for x in infos if x.digest is None]
        if bad:
            def work_bad(conn: Connection) -> int:
                return sum(conn.execute(_DELETE_BY_IDENTITY,
                                        {"p_kind": x.kind, "p_key": x.key}).rowcount
                           for x in bad)

            deleted += self.db.run(work_bad, write=True)
        if self.blobs is not None:
            for digest in sorted(digests):
                if DIGEST.match(digest):
                    self.blobs.try_delete(digest, lambda d=digest: bool(self.referenced([d])))
        return deleted, freed

    def referenced(self, digests: Sequence[str]) -> set[str]:
        """Those of ``digests`` that some row references."""
        if not digests:
            return set()
        return set(self.db.run(lambda c: list(
            c.execute(_REFERENCED, {"p_digests": list(digests)}).scalars().all())))

    def sweep_orphans(self, *, dry_run: bool = False) -> dict[str, int]:
        """SQLite: remove blob files no row references, and leftovers of dead writers,
        older than an hour (see :meth:`BlobDir.sweep`). Nothing to do on PostgreSQL."""
        if self.blobs is None:
            return {"orphan_blobs": 0, "orphan_bytes": 0, "stale_files": 0}
        return self.blobs.sweep(self.referenced, dry_run=dry_run)


def _info(r: Any) -> ArtifactInfo:
    return ArtifactInfo(
        kind=_text(r.kind) or _clip(r.kind),
        key=r.cache_key if isinstance(r.cache_key, str) else _clip(r.cache_key),
        digest=_text(r.digest, 64) if isinstance(r.digest, str) and DIGEST.match(r.digest)
        else None,
        size=_size(r.size), torch_version=_text(r.torch_version, MAX_TORCH_CHARS),
        created_at=_time(r.created_at), last_used_at=_time(r.last_used_at), hits=_int(r.hits))
