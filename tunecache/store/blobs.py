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

Other users may write the directory, so nothing below the root is trusted to be what
its name says: a blob is opened without blocking and must be a regular file of the size
its row gives (:mod:`tunecache.files`); a lock file or directory below the root that is
a symlink (or anything but a regular file, or a directory) is refused, never opened; and
prune walks and deletes without following any symlink below the root, only regular files
of the names written here. The root itself may be a symlink: an operator may keep the
blobs on another volume.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterator

from filelock import FileLock

from ..files import open_regular, regular_or_absent

__all__ = ["BlobDir", "DIGEST", "blob_dir_for", "ORPHAN_SECONDS"]

logger = logging.getLogger("tunecache")

DIGEST = re.compile(r"[0-9a-f]{64}\Z")
# A blob (or temporary file, or lock) with no row for this long is an orphan: the row of
# a put is inserted within a lock timeout of its blob, so an hour leaves every put in
# flight alone.
ORPHAN_SECONDS = 3600.0
_TMP = ".tmp."
_KEYS = "keys"  # the publishers' locks of (kind, key): <root>/keys/<h[:2]>/<h>.lock
_LOCK = ".lock"
_READ_CHUNK = 1 << 20
# The names written here; prune touches nothing else.
_SHARD = re.compile(r"[0-9a-f]{2}\Z")
_LOCK_NAME = re.compile(r"[0-9a-f]{64}\.lock\Z")
_TMP_NAME = re.compile(r"[0-9a-f]{64}\.tmp\.[0-9]+\.[0-9a-f]+\Z")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def blob_dir_for(sqlite_path: str) -> str:
    """Where the blobs of the database at ``sqlite_path`` live."""
    return sqlite_path + ".blobs"


def _fsync_dir(path: str) -> None:
    # The rename is durable only once the directory is (a host that loses power must
    # not keep a row whose blob vanished with the directory's page cache).
    try:
        fd = os.open(path, os.O_RDONLY | _DIRECTORY)
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
        # The root and the directories above it may be symlinks (an operator's volume);
        # a directory below the root must be a directory itself.
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(self.root))
        below = rel not in (".", "..") and not rel.startswith(".." + os.sep)
        if self._is_dir(path, below):
            return
        parent = os.path.dirname(path)
        if parent != path:
            self._makedirs(parent)
        try:
            os.mkdir(path)
        except FileExistsError:
            if self._is_dir(path, below):  # made meanwhile
                return
            raise
        if self.group_shared:
            with contextlib.suppress(OSError):
                mode = os.stat(path).st_mode
                os.chmod(path, stat.S_IMODE(mode) | stat.S_IRWXG | stat.S_ISGID)

    @staticmethod
    def _is_dir(path: str, below_root: bool) -> bool:
        """Whether a directory is at ``path``; below the root, raise OSError if a symlink
        (or anything but a directory) is."""
        if not below_root:
            return os.path.isdir(path)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(mode):
            return True
        raise OSError(errno.ENOTDIR, "is not a directory of the blob store (a symlink or a "
                      "file); remove it", path)

    def _lock(self, path: str) -> FileLock:
        """A filelock on ``path``, whose file is created (if absent) with this process's
        umask, and group-writable in a group-shared directory (filelock's own default
        is 0o644: another user of the group could not open it to lock)."""
        self._makedirs(os.path.dirname(path))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)
        except FileExistsError:
            # A lock file is opened for writing (filelock before 3.20.1 truncated it and
            # changed its mode, through a symlink too): only a regular file will do.
            regular_or_absent(path)
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
            fd, st = open_regular(path)
        except FileNotFoundError:
            return f"blob file {path} is missing"
        except OSError as e:
            return f"blob file {path} cannot be read: {e.strerror or os.strerror(e.errno or 0)}"
        try:
            if st.st_size != size:  # refused before anything is read
                return f"blob file {path} has {st.st_size} bytes, not {size}"
            with os.fdopen(fd, "rb") as f:
                fd = -1
                data = f.read(size + 1)  # no more, if it grew since the fstat
        except OSError as e:
            return f"blob file {path} cannot be read: {os.strerror(e.errno or 0)}"
        finally:
            if fd >= 0:
                os.close(fd)
        if len(data) != size:
            return (f"blob file {path} has {'more' if len(data) > size else len(data)} "
                    f"bytes, not {size}")
        if hashlib.sha256(data).hexdigest() != digest:
            return f"blob file {path} does not match its digest (corrupted)"
        return data

    def intact(self, path: str, digest: str, size: int) -> bool:
        """Whether the file at ``path`` holds exactly the ``size`` bytes of ``digest``."""
        try:
            fd, st = open_regular(path)
        except OSError:
            return False  # missing, or not a regular file: rewritten (renamed over it)
        h = hashlib.sha256()
        try:
            with os.fdopen(fd, "rb") as f:
                if st.st_size != size:
                    return False
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
        if not os.path.lexists(path):
            return False
        with self.locked(digest):
            if referenced():
                return False
            if not self._unlink(path):
                return False
        # The lock file stays: a put may be waiting on it right now, and a new lock file
        # beside the one it holds would let a second writer in. sweep() removes it later.
        return True

    def _unlink(self, path: str) -> bool:
        """Unlink the regular file at ``path`` (below the root), opening each directory
        below the root without following a symlink, so that a shard swapped for a
        symlink since it was walked cannot point the unlink elsewhere. False if it is
        gone or is not a regular file."""
        parts = os.path.relpath(path, self.root).split(os.sep)
        fd = os.open(self.root, os.O_RDONLY | _DIRECTORY)
        try:
            for part in parts[:-1]:
                below = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = below
            try:
                if not stat.S_ISREG(os.stat(parts[-1], dir_fd=fd,
                                            follow_symlinks=False).st_mode):
                    return False
                os.unlink(parts[-1], dir_fd=fd)
            except FileNotFoundError:
                return False
            return True
        finally:
            os.close(fd)

    def try_delete(self, digest: str, referenced: Callable[[], bool]) -> bool:
        """:meth:`delete_unless`, with a blob whose lock or shard is not what the store
        made (a symlink, a FIFO) left in place and reported in one line."""
        try:
            return self.delete_unless(digest, referenced)
        except OSError as e:
            if e.filename is None:
                raise
            logger.warning("tunecache: blob file %s left in place: %s %s", self.path(digest),
                           e.filename, e.strerror)
            return False

    def walk(self) -> Iterator[tuple[str, str, float, int]]:
        """(kind of file: blob/tmp/lock, path, mtime, size) of every regular file under
        the root of a name written here, in no particular order. Symlinks below the root
        are never followed, and anything else is not listed."""
        top = _entries(self.root)
        # (holds blobs, not publishers' locks; the shard's entry)
        shards = [(True, e) for e in top if _SHARD.match(e.name) and _is_dir(e)]
        shards += [(False, e) for k in top if k.name == _KEYS and _is_dir(k)
                   for e in _entries(k.path) if _SHARD.match(e.name) and _is_dir(e)]
        for blobs, shard in shards:
            for entry in _entries(shard.path):
                name = entry.name
                if name[:2] != shard.name:
                    continue  # not in the shard it would be written to
                if blobs and DIGEST.match(name):
                    kind = "blob"
                elif blobs and _TMP_NAME.match(name):
                    kind = "tmp"
                elif _LOCK_NAME.match(name):
                    kind = "lock"
                else:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # deleted meanwhile
                if stat.S_ISREG(st.st_mode):
                    yield kind, entry.path, st.st_mtime, st.st_size

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
            still_used = functools.partial(_any_referenced, referenced, [digest])
            if dry_run or self.try_delete(digest, still_used):
                report["orphan_blobs"] += 1
                report["orphan_bytes"] += size
        for path, _size in stale:
            if not dry_run:
                try:
                    if not self._unlink(path):
                        continue
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


def _any_referenced(referenced: Callable[[list[str]], set[str]], digests: list[str]) -> bool:
    return bool(referenced(digests))


def _entries(path: str) -> list[os.DirEntry[str]]:
    """The entries of the directory at ``path`` (none if it is gone or unreadable)."""
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """A directory itself, not a symlink to one."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False
