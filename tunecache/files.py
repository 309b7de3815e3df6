"""Opening files that other users may have put in place: blob files on shared storage and
key files at paths a setting names.

Another user who can write such a directory can leave a FIFO where a file is expected
(an ``open`` for reading then waits for a writer forever), a symlink to a file of ours
(which a write through it would damage), or a file far larger than expected. So these
files are opened without blocking, never through a final symlink unless the caller
trusts the path's own symlinks, then checked with ``fstat`` to be regular files, and
read up to a limit.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

__all__ = ["kind_of", "open_regular", "read_regular", "regular_or_absent"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` is, in words for messages."""
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def _not_regular(path: str | os.PathLike[str], mode: int) -> OSError:
    return OSError(errno.ELOOP if stat.S_ISLNK(mode) else errno.EINVAL,
                   f"is a {kind_of(mode)}, not a regular file", os.fspath(path))


def open_regular(path: str | os.PathLike[str], *,
                 follow_symlinks: bool = False) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file at ``path`` and its ``fstat``.

    Raises OSError: the open's own (FileNotFoundError, PermissionError, ...), or one whose
    strerror says "is a FIFO, not a regular file" (a symlink, unless ``follow_symlinks``;
    a directory, device or socket likewise). Never blocks on a FIFO: it is opened with
    O_NONBLOCK, which lets the open of a FIFO without a writer return at once.
    """
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow_symlinks else _NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                raise e from None
            raise _not_regular(path, mode) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        # Reads of a regular file never block; clear the flag all the same, so the
        # descriptor behaves as an ordinary open's would.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str | os.PathLike[str], limit: int, *,
                 follow_symlinks: bool = False) -> tuple[bytes, os.stat_result]:
    """At most ``limit`` bytes of the regular file at ``path`` (see :func:`open_regular`),
    with its ``fstat``; a caller that must notice a longer file asks for one byte more
    than it accepts."""
    fd, st = open_regular(path, follow_symlinks=follow_symlinks)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit), st


def regular_or_absent(path: str | os.PathLike[str]) -> None:
    """Raise OSError (as :func:`open_regular`) if something other than a regular file is
    at ``path``; nothing if a regular file or nothing is there. For paths that another
    library opens (a lock file): checked without opening, so nothing there is followed
    or blocked on."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)
