"""tunecache: tune each GEMM once per cluster, ever.

``import tunecache`` imports neither torch nor SQLAlchemy: torch imports this package at
the end of ``import torch`` (the ``torch.backends`` entry point, tunecache/_autoload.py),
so the cache, the store and Inductor's hooks load only when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    from .settings import Settings

__version__ = "0.1.0"

__all__ = [
    "open",
    "enable",
    "disable",
    "is_enabled",
    "TuneCache",
    "Result",
    "Tuned",
    "Neighbour",
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

_LAZY = {"TuneCache": "core", "Result": "core", "Tuned": "core", "Neighbour": "core",
         "Settings": "settings"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'tunecache' has no attribute {name!r}")


def enable(cache: TuneCache | None = None, *, count_only: bool = False,
           **settings: Any) -> bool:
    """Route torch.compile's GEMM autotuning through ``cache`` (default: one opened from
    ``settings`` and the environment, at the first autotuned op). See tunecache.inductor.
    """
    from .inductor import enable as enable_inductor

    return enable_inductor(cache, count_only=count_only, **settings)


def disable() -> None:
    """Restore Inductor's own autotuning."""
    from .inductor import disable as disable_inductor

    disable_inductor()


def is_enabled() -> bool:
    from .inductor import is_enabled as inductor_is_enabled

    return inductor_is_enabled()


def open(db: str | None = None, **settings: Any) -> TuneCache:
    """A :class:`TuneCache` on ``db`` (a path or URL; None: TUNECACHE_DB or the default).

    Keyword arguments override the TUNECACHE_* environment variables (``mode``,
    ``lease_seconds``, ``wait_timeout``, ``lock_timeout``, ``max_attempts``).
    """
    from .core import TuneCache
    from .settings import Settings

    return TuneCache(Settings.from_env(db=db, **settings))
