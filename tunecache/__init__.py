"""tunecache: tune each GEMM once per cluster, ever.

``import tunecache`` never imports torch; :func:`enable` and :func:`disable` do.
"""

from __future__ import annotations

from typing import Any

from .coordinator import Result, TuneCache
from .errors import (
    ConfigError,
    InvalidEntryError,
    KeyFailedError,
    SchemaOutOfDateError,
    SchemaTooNewError,
    StoreError,
    StoreTimeoutError,
    StoreUnavailableError,
    TuneCacheError,
)
from .settings import Settings

__version__ = "0.1.0"

__all__ = [
    "open",
    "enable",
    "disable",
    "TuneCache",
    "Result",
    "Settings",
    "TuneCacheError",
    "ConfigError",
    "StoreError",
    "StoreUnavailableError",
    "StoreTimeoutError",
    "SchemaTooNewError",
    "SchemaOutOfDateError",
    "KeyFailedError",
    "InvalidEntryError",
    "__version__",
]


def open(db: str | None = None, **settings: Any) -> TuneCache:  # noqa: A001 - the API's name
    """A :class:`TuneCache` on ``db`` (a path or URL; None: TUNECACHE_DB or the default).

    Keyword arguments override the TUNECACHE_* environment variables (``mode``,
    ``lease_seconds``, ``wait_timeout``, ``lock_timeout``, ``max_attempts``).
    """
    return TuneCache(Settings.from_env(db=db, **settings))
