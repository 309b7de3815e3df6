"""tunecache: tune each GEMM once per cluster, ever.

``import tunecache`` imports neither torch nor SQLAlchemy: torch imports this package at
the end of ``import torch`` (the ``torch.backends`` entry point, tunecache/_autoload.py),
so the cache, the store and Inductor's hooks load only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
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

if TYPE_CHECKING:
    from .core import Neighbour, Result, TuneCache, Tuned
    from .counters import ProcessStats
    from .settings import Levers, Settings


__all__ = [
    "open",
    "enable",
    "disable",
    "is_enabled",
    "stats",
    "reset_stats",
    "TuneCache",
    "Result",
    "Tuned",
    "Neighbour",
    "Settings",
    "Levers",
    "ProcessStats",
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

_LAZY = {"TuneCache": "core", "Result": "core", "Tuned": "core", "Neighbour": "core",
         "Settings": "settings", "Levers": "settings", "ProcessStats": "counters"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'tunecache' has no attribute {name!r}")


def enable(cache: TuneCache | None = None, *, count_only: bool = False,
           **settings: Any) -> bool:
    """Turn every part of tunecache on in this process, as the autoload hook does for a
    job that sets TUNECACHE_DB: GEMM autotuning and every Inductor part, and users'
    Triton autotuners. ``cache``: the TuneCache to use (default: one opened at the first
    use from ``settings`` over the environment, as :func:`open`). See tunecache.switch.
    """
    from .switch import enable as enable_parts

    return enable_parts(cache, count_only=count_only, **settings)


def disable() -> None:
    """Turn every part off: Inductor's and Triton's own autotuning again, every patch
    given back, the cache tunecache opened closed."""
    from .switch import disable as disable_parts

    disable_parts()


def is_enabled() -> bool:
    """Whether any part of tunecache is on in this process."""
    from .switch import is_enabled as any_on

    return any_on()


def stats() -> ProcessStats:
    """What tunecache did in this process, part by part (tunecache.counters)."""
    from .counters import stats as process_stats

    return process_stats()


def reset_stats() -> None:
    """Set this process's counters back to zero."""
    from .counters import reset_stats as reset

    reset()


def open(db: str | None = None, **settings: Any) -> TuneCache:
    """A :class:`TuneCache` on ``db`` (a path or URL; None: TUNECACHE_DB or the default).

    Keyword arguments override the TUNECACHE_* environment variables (``mode``,
    ``lease_seconds``, ``wait_timeout``, ``lock_timeout``, ``max_attempts``, ``share``,
    ``levers``, ...: the fields of :class:`Settings`).
    """
    from .core import TuneCache
    from .settings import Settings

    return TuneCache(Settings.from_env(db=db, **settings))
