"""Content-addressed files beside a SQLite database: the payloads of compiled graphs.

A payload of megabytes written inside a SQLite transaction would hold the database's
write lock for as long as the write takes (seconds on network storage), and every rank's
claim would wait for it. So the bytes live in ``<db>.blobs/<digest[:2]>/<digest>``, written
before the row's transaction; the row holds only their sha256.

A blob is written to a temporary file in its own directory, fsynced, and renamed over its
name (rename is atomic on POSIX filesystems, NFS included), so a reader sees the whole
file or none. Two writers of one digest are kept apart by a ``filelock`` on
``<digest>.lock``; the lock is only there to save work and to order a write against a
prune's delete (see :meth:`BlobDir.delete_unless`): two writers of one digest write the
same bytes, so the rename keeps the result whole even where the lock does not reach.
Publishers of one (kind, key) also hold a lock of that key (:meth:`BlobDir.publishing`),
so that ranks compiling the same graph at once write one blob between them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import stat
import time
import uuid
from typing import Callable, Iterator

from filelock import FileLock

__all__ = ["BlobDir", "DIGEST", "blob_dir_for", "ORPHAN_SECONDS"]

logger = logging.getLogger("tunecache")

DIGEST = re.compile(r"^[0-9a-f]{64}$")
# A blob (or temporary file, or lock) with no row for this long is an orphan: the row of
# a put is inserted within a lock timeout of its blob, so an hour leaves every put in
# flight alone.
ORPHAN_SECONDS = 3600.0
_TMP = ".tmp."
_KEYS = "keys"  # the publishers' locks of (kind, key): <root>/keys/<h[:2]>/<h>.lock
_LOCK = ".lock"
_READ_CHUNK = 1 << 20


def blob_dir_for(sqlite_path: str) -> str:
    """Where the blobs of the database at ``sqlite_path`` live."""
    return sqlite_path + ".blobs"


def _fsync_dir(path: str) -> None:
    # The rename is durable only once the directory is (a host that loses power must
    # not keep a row whose blob vanished with the directory's page cache).
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF):  # filesystems without dir fsync
            raise
    finally:
        os.close(fd)


class BlobDir:
    """The content-addressed files of one SQLite database.

    In a group-shared database directory (group-writable, as `tunecache doctor` asks),
    the directories and lock files made here are made group-writable too, whatever this
    process's umask: another user's job must be able to add a blob to a shard this one
    created, and to take a lock this one created (a lock file is opened for writing).
    Blob files need only be readable: they are replaced, never written in place.
    """

    def __init__(self, root: str, lock_timeout: float = 30.0) -> None:
        self.root = root
        self.lock_timeout = lock_timeout
        self._group: bool | None = None

    @property
    def group_shared(self) -> bool:
        if self._group is None:
            try:
                st = os.stat(os.path.dirname(os.path.abspath(self.root)))
                self._group = bool(st.st_mode & stat.S_IWGRP)
            except OSError:
                self._group = False
        return self._group

    def _makedirs(self, path: str) -> None:
        if os.path.isdir(path):
            return
        parent = os.path.dirname(path)
        if parent != path:
            self._makedirs(parent)
        try:
            os.mkdir(path)
        except FileExistsError:
            return
        if self.group_shared:
            with contextlib.suppress(OSError):
                mode = os.stat(path).st_mode
                os.chmod(path, stat.S_IMODE(mode) | stat.S_IRWXG | stat.S_ISGID)

    def _lock(self, path: str) -> FileLock:
        """A filelock on ``path``, whose file is created (if absent) with this process's
        umask, and group-writable in a group-shared directory (filelock's own default
        is 0o644: another user of the group could not open it to lock)."""
        self._makedirs(os.path.dirname(path))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            pass
        else:
            try:
                if self.group_shared:
                    with contextlib.suppress(OSError):
                        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode)
                                  | stat.S_IRGRP | stat.S_IWGRP)
            finally:
                os.close(fd)
        return FileLock(path, timeout=self.lock_timeout)

    def path(self, digest: str) -> str:
        if not DIGEST.match(digest):
            # A digest read from the database names a file: never let it name another one.
            raise ValueError(f"not a sha256 hex digest: {digest[:80]!r}")
        return os.path.join(self.root, digest[:2], digest)

    @contextlib.contextmanager
    def locked(self, digest: str) -> Iterator[str]:
        """The blob's path, while holding its filelock."""
        path = self.path(digest)
        with self._lock(path + _LOCK):
            yield path

    @contextlib.contextmanager
    def publishing(self, kind: str, key: str) -> Iterator[None]:
        """Held by a publisher of (kind, key) from its second look for the row to its
        commit: ranks that compiled one graph at once (their pickles need not be equal
        byte for byte) then write one blob, not one each."""
        name = hashlib.sha256(f"{kind}\0{key}".encode()).hexdigest()
        with self._lock(os.path.join(self.root, _KEYS, name[:2], name + _LOCK)):
            yield

    def read(self, digest: str, size: int) -> bytes | str:
        """The blob's bytes, or why not (missing, short, long, digest mismatch)."""
        path = self.path(digest)
        try:
            with open(path, "rb") as f:
                data = f.read(size + 1)
        except FileNotFoundError:
            return f"blob file {path} is missing"
        except OSError as e:
            return f"blob file {path} cannot be read: {os.strerror(e.errno or 0)}"
        if len(data) != size:
            return (f"blob file {path} has {'more' if len(data) > size else len(data)} "
                    f"bytes, not {size}")
        if hashlib.sha256(data).hexdigest() != digest:
            return f"blob file {path} does not match its digest (corrupted)"
        return data

    def intact(self, path: str, digest: str, size: int) -> bool:
        """Whether the file at ``path`` holds exactly the ``size`` bytes of ``digest``."""
        try:
            if os.stat(path).st_size != size:
                return False
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(_READ_CHUNK):
                    h.update(chunk)
        except OSError:
            return False
        return h.hexdigest() == digest

    def write(self, path: str, payload: bytes) -> None:
        """Write ``payload`` to ``path`` atomically (the caller holds the blob's lock)."""
        directory = os.path.dirname(path)
        tmp = f"{path}{_TMP}{os.getpid()}.{uuid.uuid4().hex[:8]}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(directory)

    def delete_unless(self, digest: str, referenced: Callable[[], bool]) -> bool:
        """Delete the blob unless ``referenced()`` (asked under its lock) says a row needs
        it. A put holds the same lock from its check of the blob to its row's commit, so a
        blob is never deleted between a put's check and its row. True if deleted."""
        path = self.path(digest)
        if not os.path.exists(path):
            return False
        with self.locked(digest):
            if referenced():
                return False
            try:
                os.unlink(path)
            except FileNotFoundError:
                return False
        # The lock file stays: a put may be waiting on it right now, and a new lock file
        # beside the one it holds would let a second writer in. sweep() removes it later.
        return True

    def walk(self) -> Iterator[tuple[str, str, float, int]]:
        """(kind of file: blob/tmp/lock/other, path, mtime, size) of every file under the
        root, in no particular order."""
        if not os.path.isdir(self.root):
            return
        shards = [(s, os.path.join(self.root, s)) for s in sorted(os.listdir(self.root))
                  if s != _KEYS]
        keys = os.path.join(self.root, _KEYS)
        if os.path.isdir(keys):
            shards += [("", os.path.join(keys, s)) for s in sorted(os.listdir(keys))]
        for shard, shard_path in shards:
            if not os.path.isdir(shard_path):
                continue
            for name in os.listdir(shard_path):
                path = os.path.join(shard_path, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # deleted meanwhile
                if shard and DIGEST.match(name) and name[:2] == shard:
                    kind = "blob"
                elif _TMP in name:
                    kind = "tmp"
                elif name.endswith(_LOCK):
                    kind = "lock"
                else:
                    kind = "other"
                yield kind, path, st.st_mtime, st.st_size

    def sweep(self, referenced: Callable[[list[str]], set[str]], *, dry_run: bool = False,
              min_age: float = ORPHAN_SECONDS) -> dict[str, int]:
        """Remove orphans older than ``min_age``: blobs no row references (``referenced``
        returns those of the given digests that some row does), temporary files of
        writers that died, and locks whose blob is gone. Returns counts and bytes."""
        now = time.time()
        old_blobs: dict[str, tuple[str, int]] = {}
        stale: list[tuple[str, int]] = []
        for kind, path, mtime, size in self.walk():
            if now - mtime < min_age:
                continue
            name = os.path.basename(path)
            if kind == "blob":
                old_blobs[name] = (path, size)
            elif kind == "tmp":
                stale.append((path, size))
            elif kind == "lock" and (os.path.basename(os.path.dirname(os.path.dirname(path)))
                                     == _KEYS or not os.path.exists(path[: -len(_LOCK)])):
                stale.append((path, 0))
        report = {"orphan_blobs": 0, "orphan_bytes": 0, "stale_files": 0}
        digests = sorted(old_blobs)
        used: set[str] = set()
        for i in range(0, len(digests), 500):
            used |= referenced(digests[i:i + 500])
        for digest in digests:
            if digest in used:
                continue
            path, size = old_blobs[digest]
            if dry_run or self.delete_unless(digest, lambda d=digest: bool(referenced([d]))):
                report["orphan_blobs"] += 1
                report["orphan_bytes"] += size
        for path, _size in stale:
            if not dry_run:
                try:
                    os.unlink(path)
                except OSError:
                    continue
            report["stale_files"] += 1
        return report

    def usage(self) -> dict[str, int]:
        """Files and bytes of blobs on disk (orphans included)."""
        files = total = 0
        for kind, _path, _mtime, size in self.walk():
            if kind == "blob":
                files += 1
                total += size
        return {"files": files, "bytes": total}
