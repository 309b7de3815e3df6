"""tunecache's errors: one base class, subclasses that carry their fields and pickle.

Inductor can compile in subprocesses, so every error must survive a round trip through
pickle: each subclass passes all of its fields to ``Exception.__init__`` (that tuple is what
pickle replays) and builds its message in ``__str__``.
"""

from __future__ import annotations

__all__ = [
    "TuneCacheError",
    "ConfigError",
    "StoreError",
    "StoreUnavailableError",
    "StoreTimeoutError",
    "SchemaTooNewError",
    "SchemaOutOfDateError",
    "KeyFailedError",
    "InvalidEntryError",
    "ReadonlyModeError",
    "EntryNotFoundError",
    "ExportFormatError",
    "SourceNotFoundError",
    "SigningKeyError",
    "FilterMatchesNothingError",
]


class TuneCacheError(Exception):
    """Base class of every error tunecache raises."""


class ConfigError(TuneCacheError, ValueError):
    """A setting (environment variable or argument) has a value tunecache cannot use."""

    def __init__(self, name: str, value: object, expected: str) -> None:
        super().__init__(name, value, expected)
        self.name = name
        self.value = value
        self.expected = expected

    def __str__(self) -> str:
        return f"{self.name}={self.value!r} is invalid: expected {self.expected}"


class StoreError(TuneCacheError):
    """The database could not serve a request."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(url, reason)
        self.url = url
        self.reason = reason

    def __str__(self) -> str:
        return f"tunecache database {self.url}: {self.reason}"


class StoreUnavailableError(StoreError):
    """The database cannot be reached or opened (server down, not a database file, …)."""


class StoreTimeoutError(StoreError):
    """The database stayed locked or busy past the configured timeout."""


class SchemaTooNewError(StoreError):
    """The database was written by a newer tunecache than this one."""

    def __init__(self, url: str, revision: str) -> None:
        super().__init__(url, revision)
        self.revision = revision

    def __str__(self) -> str:
        return (
            f"tunecache database {self.url} has schema revision {self.revision!r}, "
            "which this tunecache does not know: it was written by a newer tunecache. "
            "Upgrade tunecache (pip install -U tunecache) or point TUNECACHE_DB elsewhere."
        )


class SchemaOutOfDateError(StoreError):
    """The database needs a migration and this process may not run one (readonly mode)."""

    def __init__(self, url: str, revision: str | None) -> None:
        super().__init__(url, str(revision))
        self.revision = revision

    def __str__(self) -> str:
        # Raised where migrating is not allowed: a readonly process, or a command that
        # only reads (stats, ls, export, dry runs), which never changes the file.
        if self.revision is None:
            return (f"tunecache database {self.url} has no tunecache schema yet; run "
                    "`tunecache upgrade` to create it")
        return (
            f"tunecache database {self.url} is at schema revision {self.revision!r}, "
            "older than this tunecache; run `tunecache upgrade`"
        )


class KeyFailedError(TuneCacheError):
    """A key's tuner failed (raised or died) too many times; the key is marked failed."""

    def __init__(self, key_hash: str, attempts: int, error: str | None) -> None:
        super().__init__(key_hash, attempts, error)
        self.key_hash = key_hash
        self.attempts = attempts
        self.error = error

    def __str__(self) -> str:
        why = f": {self.error}" if self.error else ""
        return (
            f"tuning key {self.key_hash[:16]} failed {self.attempts} time(s) and is marked "
            f"failed{why}; `tunecache prune --failed` clears it"
        )


class InvalidEntryError(TuneCacheError):
    """An entry read from shared storage (or imported) does not pass validation."""

    def __init__(self, key_hash: str, reason: str) -> None:
        super().__init__(key_hash, reason)
        self.key_hash = key_hash
        self.reason = reason

    def __str__(self) -> str:
        return f"invalid tunecache entry {self.key_hash[:16]}: {self.reason}"


class ReadonlyModeError(TuneCacheError):
    """A command that writes, asked of a process in readonly mode (TUNECACHE_MODE)."""

    def __init__(self, url: str, action: str) -> None:
        super().__init__(url, action)
        self.url = url
        self.action = action

    def __str__(self) -> str:
        return (f"tunecache database {self.url}: {self.action} writes to the database, and "
                "TUNECACHE_MODE=readonly forbids writes; run it with TUNECACHE_MODE=readwrite")


class EntryNotFoundError(TuneCacheError):
    """No entry, or more than one, matches a key hash prefix."""

    def __init__(self, prefix: str, reason: str) -> None:
        super().__init__(prefix, reason)
        self.prefix = prefix
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.prefix}: {self.reason}"


class ExportFormatError(TuneCacheError):
    """An import file is not a tunecache export this tunecache can read.

    ``format_name`` and ``version`` are what this tunecache reads (tunecache.ops.exchange's
    EXPORT_FORMAT and EXPORT_VERSION), named in the message so that it shows the header
    expected.
    """

    def __init__(self, source: str, reason: str, format_name: str, version: int) -> None:
        super().__init__(source, reason, format_name, version)
        self.source = source
        self.reason = reason
        self.format_name = format_name
        self.version = version

    def __str__(self) -> str:
        return (
            f"{self.source}: {self.reason}; expected a file written by `tunecache export` "
            f"(first line {{\"format\": \"{self.format_name}\", \"version\": {self.version}, ...}})"
        )


class SourceNotFoundError(ConfigError):
    """A database named as a source to read (merge's SRC_DB) has no file there.

    A bad argument like any ConfigError (the CLI exits 2), with its own message.
    """

    def __init__(self, name: str, url: str) -> None:
        TuneCacheError.__init__(self, name, url)
        self.name = name
        self.value = url
        self.expected = "an existing database file"

    def __str__(self) -> str:
        return f"{self.name} {self.value}: no such database file"


class SigningKeyError(TuneCacheError):
    """A key file of compiled-graph signing cannot be used (missing, unreadable, not a
    regular file, not an Ed25519 key, readable by everyone, replaceable by other users)
    or cannot be written (it exists already, its directory cannot be made or is
    writable by other users)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"tunecache key file {self.path}: {self.reason}"


class FilterMatchesNothingError(ConfigError):
    """A prune keep filter (--keep-torch, ...) names a version no entry or graph has: it
    would keep nothing, and so delete everything it applies to. A bad argument (exit 2)."""

    def __init__(self, option: str, value: str, label: str, stored: list[str]) -> None:
        TuneCacheError.__init__(self, option, value, label, stored)
        self.name = option
        self.value = value
        self.expected = f"a stored {label}"
        self.label = label
        self.stored = stored

    def __str__(self) -> str:
        example = f" (e.g. {self.name} {self.stored[0]})" if self.stored else ""
        return (f"{self.name} {self.value} matches no stored {self.label}, so it would keep "
                f"nothing and delete every entry; stored: {', '.join(self.stored) or 'none'}. "
                f"Write a value exactly as stored{example}; nothing was deleted")
