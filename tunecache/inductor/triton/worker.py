"""Inductor's compile workers: whether they will read the shared cache themselves, and the
readonly TuneCache they read it through."""

from __future__ import annotations

import os
import threading
import time
from importlib import metadata
from typing import TYPE_CHECKING

import tunecache

from ...settings import Settings

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ... import TuneCache

__all__ = ["workers_read_cache", "EnvCache"]


def workers_read_cache(db_url: str) -> bool:
    """Whether Inductor's compile workers will plug in the cache of ``db_url`` themselves.

    They inherit this process's environment and run ``import torch``, which runs the
    ``torch.backends`` entry points unless TORCH_DEVICE_BACKEND_AUTOLOAD=0; ours then
    enables Triton sharing from TUNECACHE_* (:func:`enable_triton_from_env`).
    """
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0":
        return False
    try:
        env = Settings.from_env()
    except Exception:  # noqa: BLE001 - a bad environment: workers would not read it
        return False
    if env.mode == "off" or not env.triton_configs or env.db_url != db_url:
        return False
    try:
        points = metadata.entry_points(group="torch.backends")
    except Exception:  # noqa: BLE001 - broken metadata: assume not installed
        return False
    return any(p.value == "tunecache._autoload:torch_backend_entry" for p in points)


class EnvCache:
    """The TuneCache of TUNECACHE_*, opened at the first use (readonly: it only reads).

    A TuneCache that cannot reach its database stops trying for the rest of the process.
    A compile worker lives as long as its job and may first look before the compiling
    process has created the database, so it opens a fresh one, at most every
    ``RETRY_SECONDS``.
    """

    RETRY_SECONDS = 10.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: TuneCache | None = None
        self._opened = 0.0

    def __call__(self) -> TuneCache:
        with self._lock:
            stale = self._cache is not None and self._cache.disabled_reason is not None \
                and time.monotonic() - self._opened > self.RETRY_SECONDS
            if self._cache is None or stale:
                if self._cache is not None:
                    self._cache.close()
                self._cache = tunecache.open(mode="readonly")
                self._opened = time.monotonic()
            return self._cache

    def close(self) -> None:
        with self._lock:
            if self._cache is not None:
                self._cache.close()
                self._cache = None
