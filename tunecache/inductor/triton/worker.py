"""Inductor's compile workers: the settings they read from the environment, and whether
they will read the shared cache themselves."""

from __future__ import annotations

import os
from importlib import metadata

from ...errors import ConfigError
from ...settings import Settings

__all__ = ["workers_settings", "workers_read_cache"]

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
    if environment is None or environment.mode == "off" or not environment.shares("triton") \
            or environment.db_url != settings.db_url:
        return False
    try:
        points = metadata.entry_points(group="torch.backends")
    except Exception:  # noqa: BLE001 - broken metadata: assume not installed
        return False
    return any(p.value == "tunecache._autoload:torch_backend_entry" for p in points)
