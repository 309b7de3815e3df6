"""Inductor's compile workers: the settings they read from the environment, whether they
will read the shared cache themselves, and the readonly cache they read it through."""

from __future__ import annotations

import dataclasses
import os
from importlib import metadata

from ...errors import ConfigError
from ...settings import Settings
from ..opener import CacheOpener

__all__ = ["workers_settings", "workers_read_cache", "readonly_cache", "RETRY_SECONDS"]

# A TuneCache that cannot reach its database stops trying for the rest of the process. A
# compile worker lives as long as its job and may first look before the compiling process
# has created the database, so its cache is opened afresh, at most this often.
RETRY_SECONDS = 10.0


def workers_settings() -> Settings | None:
    """TUNECACHE_* as Inductor's compile workers will read it (they inherit this process's
    environment), or None where it does not parse (then they could not use it)."""
    try:
        return Settings.from_env()
    except ConfigError:
        return None


def workers_read_cache(settings: Settings, environment: Settings | None) -> bool:
    """Whether Inductor's compile workers will plug in the cache of ``settings``
    themselves, reading ``environment`` (:func:`workers_settings`).

    They inherit this process's environment and run ``import torch``, which runs the
    ``torch.backends`` entry points unless TORCH_DEVICE_BACKEND_AUTOLOAD=0; ours then
    enables Triton sharing from TUNECACHE_* (:func:`enable_triton_from_env`).
    """
    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0":
        return False
    if environment is None or environment.mode == "off" or not environment.triton_configs \
            or environment.db_url != settings.db_url:
        return False
    try:
        points = metadata.entry_points(group="torch.backends")
    except Exception:  # noqa: BLE001 - broken metadata: assume not installed
        return False
    return any(p.value == "tunecache._autoload:torch_backend_entry" for p in points)


def readonly_cache(settings: Settings) -> CacheOpener:
    """The TuneCache of ``settings`` in readonly mode (a worker only reads), opened at the
    first use and afresh, at most every :data:`RETRY_SECONDS`, while it cannot reach its
    database."""
    return CacheOpener(dataclasses.replace(settings, mode="readonly"),
                       retry_seconds=RETRY_SECONDS)
