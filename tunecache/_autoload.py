"""Activation with no code change: ``TUNECACHE_DB=... python train.py``.

torch (2.5 and later; present in 2.11-2.14, ``torch/__init__.py``
``_import_device_backends``) loads every entry point of the group ``torch.backends``
near the end of ``import torch``, unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. Ours is
:func:`torch_backend_entry`. It must be cheap and must never raise, because an exception
there makes ``import torch`` itself fail:

* ``TUNECACHE_DB`` unset (or ``TUNECACHE_MODE=off``): return at once. Nothing else is
  imported; the cost is importing this small module.
* otherwise: install a post-import hook (a ``sys.meta_path`` finder) that calls
  ``tunecache.inductor.enable()`` right after ``torch._inductor.select_algorithm`` has
  been imported, i.e. just before the first autotuned op can be lowered, or immediately
  if that module is already imported. We never import ``torch._inductor`` ourselves
  here: ``torch`` is only half initialised while entry points run, and a job that never
  compiles should not pay for Inductor.

``TUNECACHE_INDUCTOR_COUNT_ONLY=1`` installs only the benchmark counter instead (used by
tools/bench_gpu.py to count plain max-autotune runs), even without ``TUNECACHE_DB``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import types
from typing import Sequence

__all__ = ["torch_backend_entry", "install_import_hook"]

log = logging.getLogger("tunecache")

_TARGET = "torch._inductor.select_algorithm"
_lock = threading.Lock()
_done = False


def _wanted() -> bool:
    if os.environ.get("TUNECACHE_INDUCTOR_COUNT_ONLY") == "1":
        return True
    if not os.environ.get("TUNECACHE_DB", "").strip():
        return False
    return os.environ.get("TUNECACHE_MODE", "").strip().lower() != "off"


def _enable() -> None:
    global _done
    with _lock:
        if _done:
            return
        _done = True
    try:
        from . import inductor

        inductor._enable_from_env()
    except Exception as e:  # noqa: BLE001 - activation must never break the user's job
        log.warning(
            "tunecache: could not enable the Inductor integration (%s: %s); Inductor "
            "autotunes as usual",
            type(e).__name__,
            e,
        )


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then enables tunecache on the fresh module."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)  # type: ignore[attr-defined]
        _enable()


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of ``torch._inductor.select_algorithm``; nothing else."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        # Ask the finders after us for the real spec, then wrap its loader.
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install_import_hook() -> None:
    """Enable tunecache once select_algorithm is imported (now, if it already is)."""
    if _TARGET in sys.modules:
        _enable()
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def torch_backend_entry() -> None:
    """Entry point of the ``torch.backends`` group (see the module docstring)."""
    try:
        if _wanted():
            install_import_hook()
    except Exception as e:  # noqa: BLE001 - never make `import torch` fail
        log.warning(
            "tunecache: autoload failed (%s: %s); Inductor autotunes as usual",
            type(e).__name__,
            e,
        )
