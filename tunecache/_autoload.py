"""Activation with no code change: ``TUNECACHE_DB=... python train.py``.

torch (2.5 and later; present in 2.11-2.15, ``torch/__init__.py``
``_import_device_backends``) loads every entry point of the group ``torch.backends``
near the end of ``import torch``, unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. Ours is
:func:`torch_backend_entry`. It must be cheap and must never raise, because an exception
there makes ``import torch`` itself fail:

* ``TUNECACHE_DB`` unset: return at once. Nothing else is imported; the cost is importing
  this small module.
* otherwise: read the settings once (:func:`tunecache.switch.autoload`: a bad value is one
  line saying tunecache is off in this job, naming every part), and install a post-import
  hook (a ``sys.meta_path`` finder) that asks the switch for the parts of each module they
  hook right after it is imported (:func:`tunecache.switch.enable_target`), or at once for
  a module already imported: ``triton.runtime.autotuner`` (users' autotuners, before any
  library decorates a kernel), ``torch._inductor.runtime.autotune_cache`` (Triton configs:
  Inductor's compile workers import it, never select_algorithm, when they load a kernel)
  ``torch._inductor.select_algorithm`` (the GEMM hooks and the other Inductor parts,
  just before the first autotuned op can be lowered) and ``torch._inductor.choices``
  (narrowing, which wraps its InductorChoices; that module imports select_algorithm
  before it is whole). We never import ``torch._inductor``
  ourselves here: ``torch`` is only half initialised while entry points run, and a job
  that never compiles should not pay for Inductor.
* with a signing or verify key (and kernels shared), the switch sets
  ``TRITON_CACHE_MANAGER`` to tunecache.triton_cache's manager unless the user set one:
  Inductor starts its compile workers, which copy the environment, before select_algorithm
  is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import types
from collections.abc import Sequence

__all__ = ["torch_backend_entry", "install_import_hook"]

log = logging.getLogger("tunecache")


def _enable(target: str) -> None:
    try:
        from .switch import enable_target

        enable_target(target)
    except Exception as e:  # noqa: BLE001 - activation must never break the user's job
        log.warning("tunecache: could not enable the parts of %s (%s: %s); they run as "
                    "without tunecache", target, type(e).__name__, e)


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then enables tunecache's parts of the fresh module."""

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
        self._seen: set[str] = set()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._targets or fullname in self._seen:
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
                    self._seen.add(fullname)
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


def install_import_hook() -> None:
    """Read the settings once and enable tunecache's parts as their modules are imported
    (now, for those that are)."""
    from .switch import autoload

    targets = autoload()
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
        if os.environ.get("TUNECACHE_DB", "").strip():
            install_import_hook()
    except Exception as e:  # noqa: BLE001 - never make `import torch` fail
        log.warning(
            "tunecache: autoload failed (%s: %s); Inductor autotunes as usual",
            type(e).__name__,
            e,
        )
