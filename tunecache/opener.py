"""The one TuneCache of a process: every part reaches the database through one
:class:`CacheOpener` (tunecache.process holds it).

GEMM lookups, Triton configs, compiled graphs and kernels, shape profiles and users'
kernels all go through it: the cache given to enable(), or one opened from its settings at
the first use (a job that compiles nothing autotuned never opens a connection). A cache
that failed to open is not retried in a compiling process: the hooks fall back to
Inductor's own behaviour, as for any store failure. Elsewhere (Inductor's compile
workers, a job of users' Triton kernels alone: ``retry_seconds``) a cache that stopped
reaching its database is replaced, at most that often.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .core.cache import TuneCache
    from .settings import Settings

__all__ = ["CacheOpener", "RETRY_SECONDS"]

# A TuneCache that cannot reach its database stops trying for the rest of the process. A
# process that does not compile (one of Inductor's compile workers, which lives as long
# as its job and may first look before the compiling process has created the database; a
# job of users' Triton kernels alone) opens its cache afresh, at most this often. A
# compiling process falls back to Inductor's own behaviour instead (the switch clears
# ``retry_seconds`` when the GEMM part comes on).
RETRY_SECONDS = 10.0


class CacheOpener:
    """Call it for the TuneCache of ``settings`` (``cache`` where one was given: then the
    caller owns it, and :meth:`close` leaves it open).

    ``retry_seconds``: a cache it opened that stopped reaching its database (a TuneCache
    then tunes locally for the rest of the process) is closed and opened afresh at the
    next call, once it is that old.
    """

    def __init__(self, settings: Settings, cache: TuneCache | None = None, *,
                 retry_seconds: float | None = None) -> None:
        self.settings = settings
        self._cache = cache
        self._owned = cache is None
        self._lock = threading.Lock()
        self.broken = False  # opening failed: Inductor's own behaviour from now on
        self.retry_seconds = retry_seconds
        self._opened = 0.0  # time.monotonic() when this opener last opened its cache
        self.used = False  # something asked for the database

    def __call__(self) -> TuneCache:
        self.used = True
        with self._lock:
            if self.broken:
                raise RuntimeError("the tunecache database could not be opened earlier")
            if self._cache is not None and self._stale(self._cache):
                stale, self._cache = self._cache, None
                stale.close()
            if self._cache is None:
                from .core.cache import TuneCache

                try:
                    self._cache = TuneCache(self.settings)
                except BaseException:
                    self.broken = True
                    raise
                self._opened = time.monotonic()
            return self._cache

    def _stale(self, cache: TuneCache) -> bool:
        return self.retry_seconds is not None and self._owned \
            and cache.disabled_reason is not None \
            and time.monotonic() - self._opened > self.retry_seconds

    def close(self) -> None:
        """Close the cache this opener opened (one given to it stays open)."""
        with self._lock:
            cache, self._cache = self._cache, None
        if self._owned and cache is not None:
            cache.close()
