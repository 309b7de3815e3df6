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
* with a signing or verify key (and neither ``TUNECACHE_GRAPHS=0`` nor
  ``TUNECACHE_KERNELS=0``), set ``TRITON_CACHE_MANAGER`` to tunecache.triton_cache's manager
  unless the user set one: Inductor starts its compile workers, which copy the
  environment, before select_algorithm is imported.
* unless ``TUNECACHE_TRITON_CONFIGS=0``, the same hook also plugs the Triton autotune cache
  in right after ``torch._inductor.runtime.autotune_cache`` is imported. Inductor's
  compile workers import that module, never select_algorithm, when they load a kernel
  (tunecache.inductor's Triton section).

* unless ``TUNECACHE_USER_KERNELS=0``, it also puts tunecache in front of Triton's own
  autotuner right after ``triton.runtime.autotuner`` is imported, before any library
  decorates a kernel with ``@triton.autotune`` (tunecache.user_kernels).

``TUNECACHE_INDUCTOR_COUNT_ONLY=1`` installs only the benchmark counter instead (used by
tools/bench_gpu.py to count plain max-autotune runs), even without ``TUNECACHE_DB``.

These variables are read through :func:`tunecache.settings.activation`, which imports
nothing heavy.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import types
from collections.abc import Sequence

from .settings import Activation, activation

# tunecache.triton_cache's manager, named here without importing it (or SQLAlchemy).
MANAGER_VAR = "TRITON_CACHE_MANAGER"
MANAGER = "tunecache.triton_cache:KernelCacheManager"

__all__ = ["torch_backend_entry", "install_import_hook"]

log = logging.getLogger("tunecache")

_TARGET = "torch._inductor.select_algorithm"
_TRITON_TARGET = "torch._inductor.runtime.autotune_cache"
_USER_KERNELS_TARGET = "triton.runtime.autotuner"
_lock = threading.Lock()
_done: set[str] = set()
# Failures already reported: every target reads the same settings, and a bad one would
# otherwise be reported once per target.
_reported: set[str] = set()


def _enable(target: str) -> None:
    with _lock:
        if target in _done:
            return
        _done.add(target)
    try:
        if target == _TARGET:
            from .inductor.switch import enable_from_env

            enable_from_env()
        elif target == _USER_KERNELS_TARGET:
            from . import user_kernels

            user_kernels.enable_from_env()
        else:
            from .inductor.triton import enable_triton_from_env

            enable_triton_from_env()
    except Exception as e:  # noqa: BLE001 - activation must never break the user's job
        problem = f"{type(e).__name__}: {e}"
        with _lock:
            first = problem not in _reported
            _reported.add(problem)
        if first:
            if target == _USER_KERNELS_TARGET:
                log.warning("tunecache: could not share users' Triton kernels' autotuning "
                            "(%s); Triton autotunes them as usual", problem)
            else:
                log.warning("tunecache: could not enable the Inductor integration (%s); "
                            "Inductor autotunes as usual", problem)


def _targets(plan: Activation) -> tuple[str, ...]:
    return ((_TARGET,) + ((_TRITON_TARGET,) if plan.triton else ())
            + ((_USER_KERNELS_TARGET,) if plan.user_kernels else ()))


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then enables tunecache on the fresh module."""

    def __init__(self, inner: importlib.abc.Loader, target: str) -> None:
        self._inner = inner
        self._target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        _enable(self._target)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of ``targets`` (module names); nothing else."""

    def __init__(self, targets: tuple[str, ...]) -> None:
        self._targets = targets  # read once: find_spec runs for every import

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._targets or fullname in _done:
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
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


def install_import_hook() -> None:
    """Enable tunecache once its target modules are imported (now, for those that are)."""
    plan = activation()
    if plan.kernels and not os.environ.get(MANAGER_VAR):
        # Before Inductor's compile workers start: they copy the environment once.
        os.environ[MANAGER_VAR] = MANAGER
    targets = _targets(plan)
    pending = False
    for target in targets:
        if target in sys.modules:
            _enable(target)
        else:
            pending = True
    if pending and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(targets))


def torch_backend_entry() -> None:
    """Entry point of the ``torch.backends`` group (see the module docstring)."""
    try:
        if activation().hook:
            install_import_hook()
    except Exception as e:  # noqa: BLE001 - never make `import torch` fail
        log.warning(
            "tunecache: autoload failed (%s: %s); Inductor autotunes as usual",
            type(e).__name__,
            e,
        )
