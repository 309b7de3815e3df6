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

The job's statements are here, beside the operations that run them; what a row is and
how its columns are read back is :mod:`.artifact_rows`; the operators' statements (stats,
ls, prune, export) are :mod:`.artifact_queries`, which :class:`ArtifactStore` runs by
name for tunecache.ops.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from filelock import Timeout
from sqlalchemy import (
    BigInteger,
    Connection,
    Float,
    and_,
    bindparam,
    case,
    exc,
    func,
    null,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import NullType

from ..errors import ReadonlyModeError, StoreError, StoreTimeoutError
from . import artifact_queries, columns
from .artifact_queries import GraphFilter
from .artifact_rows import (
    ARTIFACT_KINDS,
    IDENTITY,
    MAX_KEY_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_SIGNATURE_BYTES,
    MAX_TORCH_CHARS,
    NOW,
    TOUCH_SECONDS,
    Artifact,
    ArtifactInfo,
    validate_identity,
    validate_put,
)
from .blobs import DIGEST, BlobDir, blob_dir_for
from .engine import Database
from .schema import artifacts

__all__ = [
    "Artifact",
    "ArtifactInfo",
    "ArtifactStore",
    "GraphFilter",
    "ARTIFACT_KINDS",
    "MAX_KEY_CHARS",
    "MAX_SIGNATURE_BYTES",
    "MAX_TORCH_CHARS",
    "MAX_PAYLOAD_BYTES",
    "TOUCH_SECONDS",
    "validate_identity",
]

logger = logging.getLogger("tunecache")

# -- the statements -----------------------------------------------------------------------

# Text and bytes a row's writer chose are bounded in SQL (columns.bounded): past its bound
# a value comes back NULL, never read, and the row is refused like any malformed one.
_DIGEST = columns.bounded(artifacts.c.digest, 64)
_META = (_DIGEST, columns.bounded(artifacts.c.signature, MAX_SIGNATURE_BYTES),
         artifacts.c.size, columns.bounded(artifacts.c.torch_version, MAX_TORCH_CHARS),
         artifacts.c.created_at, artifacts.c.last_used_at)
# PostgreSQL: the payload's length is read first (octet_length reads the stored value's
# header, not the value), and the bytes only come back when they are as many as the row
# says and within MAX_PAYLOAD_BYTES: a row that claims gigabytes costs no read of them.
_PG_PAYLOAD_BYTES = func.octet_length(artifacts.c.payload)
# The bound is the reader's (p_limit: at most MAX_PAYLOAD_BYTES; a kind may read less).
_PG_PAYLOAD = case(
    (and_(artifacts.c.size == _PG_PAYLOAD_BYTES,
          artifacts.c.size <= bindparam("p_limit", type_=BigInteger)), artifacts.c.payload),
    else_=null())
_READ = {
    "sqlite": select(*_META, NOW.label("now")).where(IDENTITY),
    "postgresql": select(*_META, _PG_PAYLOAD_BYTES.label("payload_bytes"),
                         _PG_PAYLOAD.label("payload"), NOW.label("now")).where(IDENTITY),
}
# The PostgreSQL read, as psycopg runs it (compiled once from the statement above): in
# binary format, a bytea comes as its bytes; in text format (all SQLAlchemy asks for) as
# hex, twice its size, to be decoded. Reading 10 MB took 0.03 s against 0.20 s.
_PG_READ_SQL = str(_READ["postgresql"].compile(dialect=postgresql.psycopg.dialect()))


def _pg_read_binary(conn: Connection, params: dict[str, Any]) -> Any:
    """The row of _READ["postgresql"], read in binary format on the driver's connection.
    A driver error is wrapped as SQLAlchemy would have, so that Database.run retries
    and translates it as it does every other."""
    import psycopg
    from psycopg.rows import namedtuple_row

    driver = conn.connection.driver_connection
    assert driver is not None  # the connection of a running transaction is open
    try:
        with driver.cursor(binary=True, row_factory=namedtuple_row) as cur:
            cur.execute(_PG_READ_SQL, params)
            return cur.fetchone()
    except psycopg.Error as e:
        raise exc.DBAPIError.instance(_PG_READ_SQL, params, e, psycopg.Error,
                                      dialect=conn.dialect) from e


_EXISTS = select(_DIGEST, artifacts.c.size).where(IDENTITY)
_TOUCH = (
    update(artifacts)
    .where(IDENTITY, or_(artifacts.c.last_used_at.is_(None),
                          artifacts.c.last_used_at < NOW - TOUCH_SECONDS))
    .values(last_used_at=NOW)
)


def _insert_statement(dialect: str) -> Any:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        insert(artifacts)
        .values(kind=bindparam("p_kind"), cache_key=bindparam("p_key"),
                digest=bindparam("p_digest"), signature=bindparam("p_signature"),
                size=bindparam("p_size"), torch_version=bindparam("p_torch_version"),
                # An import keeps the source's times and loads; a job's publish is now.
                created_at=func.coalesce(bindparam("p_created_at", type_=Float), NOW),
                last_used_at=func.coalesce(bindparam("p_last_used_at", type_=Float),
                                           bindparam("p_created_at", type_=Float), NOW),
                hits=bindparam("p_hits"), payload=bindparam("p_payload"))
        .on_conflict_do_nothing(index_elements=["kind", "cache_key"])
        .returning(artifacts.c.kind)
    )


_INSERT = {d: _insert_statement(d) for d in ("sqlite", "postgresql")}
# replace's compare-and-swap: the row is rewritten only if its digest and signature are
# still the ones the replacer read and refused. Compared untyped and null-safe (IS / IS NOT
# DISTINCT FROM): a hostile SQLite row may hold NULL, text or a number in either column,
# and must still be replaceable.
_ROW_VERSION = select(_DIGEST, columns.bounded(artifacts.c.signature, MAX_SIGNATURE_BYTES)
                      ).where(IDENTITY)
_UNCHANGED = and_(
    type_coerce(artifacts.c.digest, NullType()).is_not_distinct_from(
        bindparam("p_old_digest", type_=NullType())),
    type_coerce(artifacts.c.signature, NullType()).is_not_distinct_from(
        bindparam("p_old_signature", type_=NullType())),
)
_REPLACE = (
    update(artifacts)
    .where(IDENTITY, _UNCHANGED)
    .values(digest=bindparam("p_digest"), signature=bindparam("p_signature"),
            size=bindparam("p_size"), torch_version=bindparam("p_torch_version"),
            created_at=NOW, last_used_at=NOW, payload=bindparam("p_payload"))
    .returning(artifacts.c.kind)
)
# A job's loads of one entry, batched: the count added, the last use moved to the time of
# the last load (never back: jobs flush in any order).
_RECORD_USES = (
    update(artifacts)
    .where(IDENTITY)
    .values(hits=artifacts.c.hits + bindparam("p_n"),
            last_used_at=case((or_(artifacts.c.last_used_at.is_(None),
                                   artifacts.c.last_used_at < bindparam("p_at", type_=Float)),
                               bindparam("p_at", type_=Float)),
                              else_=artifacts.c.last_used_at))
)

class _OncePerStore:
    """Which one-time lines a store has said (thread-safe: Inductor's compile threads
    share a store)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._said: set[str] = set()

    def first(self, what: str) -> bool:
        """Whether this is the first time ``what`` is said (and now it has been)."""
        with self._lock:
            if what in self._said:
                return False
            self._said.add(what)
            return True


class ArtifactStore:
    """Compiled graphs over the same :class:`Database` the tuning :class:`ClaimStore` uses."""

    def __init__(self, db: Database) -> None:
        self.db = db
        path = db.sqlite_path
        self.blobs: BlobDir | None = (BlobDir(blob_dir_for(path), db.lock_timeout)
                                      if db.is_sqlite and path else None)
        # One warning per store for unreadable entries, and one for repaired blobs: a
        # database copied without its blob directory makes every entry unreadable, and a
        # job reads hundreds of kernels.
        self._said = _OncePerStore()

    # -- the job's side -------------------------------------------------------------------

    def get(self, kind: str, key: str, *, touch: bool = True,
            limit: int = MAX_PAYLOAD_BYTES) -> Artifact | None:
        """The artifact, or None if absent or unreadable (a row or blob that is not what
        was published, or one whose row claims more than ``limit`` bytes, refused before
        any of them is read: the store's first such entry is a warning, later ones are
        logged at debug level). With ``touch``, at most once an hour per
        artifact, a read records its use (a short write, skipped on a readonly database);
        a job's loads are counted instead (:meth:`record_uses`)."""
        if validate_identity(kind, key) is not None:
            return None  # nothing can be stored under it
        found, row = self._fetch(kind, key, min(limit, MAX_PAYLOAD_BYTES))
        if found is None or isinstance(found, str):
            if found is not None:
                first = self._said.first("unreadable")
                logger.log(logging.WARNING if first else logging.DEBUG,
                           "tunecache: stored %s entry %s: %s; ignored%s", kind,
                           columns.clip(key, 40), found,
                           " (further unreadable entries are logged at debug level)"
                           if first else "")
            return None
        last_used = columns.time(row.last_used_at)
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

    def examine(self, kind: str, key: str, limit: int = MAX_PAYLOAD_BYTES
                ) -> tuple[Artifact | str | None, Any, Any]:
        """For a publisher whose put found the row there: the artifact (or why it is
        unreadable, or None if gone since), with the row's digest and signature exactly as
        read, which :meth:`replace` takes to swap only that row. No warning, no recorded
        use. ``limit``: the kind's own bound, as :meth:`get` takes it (a rewrite of a
        planted profile read all of it)."""
        if validate_identity(kind, key) is not None:
            return None, None, None
        found, row = self._fetch(kind, key, min(limit, MAX_PAYLOAD_BYTES))
        if row is None:
            return None, None, None
        return found, row.digest, row.signature

    def _fetch(self, kind: str, key: str,
               limit: int = MAX_PAYLOAD_BYTES) -> tuple[Artifact | str | None, Any]:
        params: dict[str, Any] = {"p_kind": kind, "p_key": key, "p_limit": limit}
        if self.db.dialect == "postgresql":
            row = self.db.run(lambda c: _pg_read_binary(c, params))
        else:
            row = self.db.run(lambda c: c.execute(_READ["sqlite"], params).first())
        if row is None:
            return None, None
        digest = columns.text(row.digest, 64)
        # Read unbounded, so that a row claiming more than any publish writes is named as
        # such below (payload_size would call it malformed).
        size = columns.integer(row.size)
        signature = columns.binary(row.signature)
        created_at = columns.time(row.created_at)
        torch_version = columns.text(row.torch_version, MAX_TORCH_CHARS)
        if digest is None or not DIGEST.match(digest) or size is None or size < 0 \
                or signature is None or created_at is None or torch_version is None:
            return "its database row is malformed", row
        if size > MAX_PAYLOAD_BYTES:  # never written by a store: refused before any read
            return (f"its database row claims {size} bytes, more than the store's limit of "
                    f"{MAX_PAYLOAD_BYTES}"), row
        if size > limit:  # a kind's own bound, checked before its bytes are read
            return f"its database row claims {size} bytes, more than {limit} for a {kind}", row
        if self.blobs is not None:
            data: bytes | str = self.blobs.read(digest, size)
        else:
            raw = columns.binary(row.payload)
            stored = columns.integer(row.payload_bytes)
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
        """Add loads to the entries' counts (compiled graphs and kernels alike): (kind,
        key) -> (loads, time of the last), in one transaction. An entry pruned meanwhile
        is skipped."""
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
            torch_version: str, *, created_at: float | None = None,
            last_used_at: float | None = None, hits: int = 0) -> bool:
        """Publish; True when this call published, False when (kind, key) was there.
        ``created_at``, ``last_used_at`` and ``hits``: an import's, kept from its source
        (by default the publish is now, and its own first use).

        Raises ValueError for arguments that cannot be stored (key over 512 characters,
        payload over MAX_PAYLOAD_BYTES, ...), ReadonlyModeError on a readonly database,
        and the store's errors (tunecache.errors.StoreError) for the database's.
        """
        payload, digest, params = self._row_to_write(
            "publishing", kind, key, payload, signature, torch_version)
        params.update(p_created_at=created_at, p_last_used_at=last_used_at, p_hits=hits)
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
        validate_put(kind, key, payload, signature, torch_version)
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
            healthy = os.stat(path).st_size == columns.integer(existing.size)
        except OSError:
            healthy = False
        if healthy:
            return
        try:
            with self.blobs.locked(digest) as path:
                if not self.blobs.intact(path, digest, len(payload)):
                    first = self._said.first("repaired")
                    logger.log(logging.WARNING if first else logging.DEBUG,
                               "tunecache: blob %s was missing or damaged; rewritten%s", path,
                               " (further repairs are logged at debug level)" if first else "")
                    self.blobs.write(path, payload)
        except (OSError, Timeout) as e:  # a repair; the publish itself was not ours
            logger.debug("tunecache: blob %s not repaired: %s", path, e)

    # -- the operators' side (statements: artifact_queries) ------------------------------

    def stats(self) -> list[dict[str, Any]]:
        """Count, bytes, oldest creation and last use, loads and entries ever loaded, by
        kind and torch version; ``invalid`` counts rows whose size is impossible (see
        payload_size), left out of bytes."""
        return self.db.run(artifact_queries.stats)

    def infos(self, where: GraphFilter | None = None) -> Iterator[list[ArtifactInfo]]:
        """Every row's metadata (never the payload), page by page in key order."""
        after: tuple[str, str] | None = ("", "")
        while after is not None:
            page, after = self.db.run(
                functools.partial(artifact_queries.info_page, where=where, after=after))
            if page:
                yield page

    def count(self, where: GraphFilter | None = None) -> int:
        return self.db.run(lambda c: artifact_queries.count(c, where))

    def exists(self, kind: str, key: str) -> bool:
        params = {"p_kind": kind, "p_key": key}
        return self.db.run(lambda c: c.execute(_EXISTS, params).first()) is not None

    def listing(self, where: GraphFilter | None, limit: int) -> list[ArtifactInfo]:
        """The most recently used first."""
        return self.db.run(lambda c: artifact_queries.listing(c, where, limit))

    def delete(self, infos: Sequence[ArtifactInfo]) -> tuple[int, int]:
        """Delete these rows if unchanged since read (same digest, no use recorded
        since), then their blobs that no row references. (rows, payload bytes) deleted."""
        deleted = freed = 0
        digests: set[str] = set()
        page = artifact_queries.PAGE
        for i in range(0, len(infos), page):
            chunk = [x for x in infos[i:i + page] if x.digest is not None]
            gone = self.db.run(
                functools.partial(artifact_queries.delete_unchanged, infos=chunk), write=True)
            for digest, size in gone:
                deleted += 1
                freed += size
                if digest is not None:
                    digests.add(digest)
        # Malformed rows (no digest) are deleted by identity alone.
        bad = [x for x in infos if x.digest is None]
        if bad:
            deleted += self.db.run(lambda c: artifact_queries.delete_by_identity(c, bad),
                                   write=True)
        if self.blobs is not None:
            for digest in sorted(digests):
                if DIGEST.match(digest):
                    self.blobs.try_delete(digest, functools.partial(self._referenced_one, digest))
        return deleted, freed

    def referenced(self, digests: Sequence[str]) -> set[str]:
        """Those of ``digests`` that some row references."""
        if not digests:
            return set()
        return self.db.run(lambda c: artifact_queries.referenced(c, digests))

    def _referenced_one(self, digest: str) -> bool:
        return bool(self.referenced([digest]))

    def sweep_orphans(self, *, dry_run: bool = False) -> dict[str, int]:
        """SQLite: remove blob files no row references, and leftovers of dead writers,
        older than an hour (see :meth:`BlobDir.sweep`). Nothing to do on PostgreSQL."""
        if self.blobs is None:
            return {"orphan_blobs": 0, "orphan_bytes": 0, "stale_files": 0}
        return self.blobs.sweep(self.referenced, dry_run=dry_run)
