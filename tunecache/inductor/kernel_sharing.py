"""Compiled Triton kernels shared across graphs and nodes: tunecache as Triton's cache
manager (tunecache.triton_cache) in this process and its compile workers, and kernel names
that depend on a kernel's source, not on its position in the graph.

Why the names: Triton's cache key hashes the kernel's source, which holds the kernel's
name, and Inductor names a kernel ``triton_<category>_<fused ops>_<n>`` with ``n`` the
count of kernels the graph defined before it (``TritonScheduling.define_kernel`` calls
``wrapper.next_kernel_suffix()``; read in torch 2.11 and 2.13). The same kernel in a graph
with one more layer gets another ``n``, so another key, and compiles again.
``config.triton.unique_kernel_names=False`` would name them all ``triton_`` and leave
profiler traces unreadable. Here ``n`` becomes a hash of the kernel's source as the
scheduler generated it, before the name is put in: the descriptive part stays, and the
same kernel gets the same name in every graph. Two different kernels of one graph get
different hashes (64 bits), and the same source is one kernel already
(``wrapper.src_to_kernel``).

Why one ptxas: Triton's cache key holds the output of ``ptxas --version`` (its CUDA
backend's hash). Inductor's compile workers point Triton at the ptxas shipped in torch's
own ``bin/`` where the wheel has one (``_set_triton_ptxas_path`` in
``torch/_inductor/runtime/compile_tasks.py``, at worker start), while the main process uses
Triton's bundled ptxas until its first compile outside the workers. A kernel compiled in a
worker by one job and in the main process by the next (a coordinate descent's winner, a
stored config compiled where the first job benchmarked) then has two keys, and the second
job compiles what the database holds. So this process takes the workers' ptxas when
kernels are shared, as Inductor itself does before it compiles here (a
TRITON_PTXAS_PATH the user set is kept).
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import TYPE_CHECKING, Any

from .. import triton_cache
from ..parts import Part
from ..process import PROCESS
from .compat import InductorChanged, explain_once, param_names
from .state import REGISTRY

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..opener import CacheOpener
    from ..patching import Ledger
    from ..settings import Settings

__all__ = ["KERNELS", "enable_kernels", "disable_kernels", "content_suffix", "MANAGER_VAR"]

log = logging.getLogger("tunecache")

MANAGER_VAR = triton_cache.MANAGER_VAR
PTXAS_VAR = "TRITON_PTXAS_PATH"
_DEFINE_PARAMS = ("src_code", "node_schedule", "kernel")


def content_suffix(source: str) -> str:
    """The name suffix of the kernel whose generated source (name not yet put in) is
    ``source``."""
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def probe_kernels() -> None:
    """Raise :class:`InductorChanged` where the kernel naming kernel sharing wraps
    differs (the Triton runtime's methods are checked as they are wrapped)."""
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    if param_names(TritonScheduling.define_kernel) != _DEFINE_PARAMS \
            or param_names(PythonWrapperCodegen.next_kernel_suffix) != ():
        raise InductorChanged("TritonScheduling.define_kernel or next_kernel_suffix changed "
                              "signature")


def _install_content_names() -> None:
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    probe_kernels()
    orig_define = TritonScheduling.define_kernel
    orig_suffix = PythonWrapperCodegen.next_kernel_suffix
    local = REGISTRY.kernel_names_local

    def define_kernel(self: Any, src_code: str, node_schedule: Any, kernel: Any) -> Any:
        outer = getattr(local, "suffix", None)
        local.suffix = content_suffix(src_code) if isinstance(src_code, str) else None
        try:
            return orig_define(self, src_code, node_schedule, kernel)
        finally:
            local.suffix = outer

    def next_kernel_suffix(self: Any) -> str:
        suffix = getattr(local, "suffix", None)
        if suffix is None:
            return orig_suffix(self)
        local.suffix = None  # one name per kernel defined; anything else counts as before
        return suffix

    PROCESS.ledger.patch(TritonScheduling, "define_kernel", define_kernel)
    PROCESS.ledger.patch(PythonWrapperCodegen, "next_kernel_suffix", next_kernel_suffix)


def _install_publish_on_choice() -> None:
    """Publish a graph kernel once Inductor keeps one launcher of it: after a compile that
    leaves one config (precompile, outside a worker's warm-up), after autotuning picks one
    (autotune_to_one_config), and after coordinate descent (its launcher). Every other
    config Inductor compiled for the kernel was only benchmarked; so, at most two entries
    per kernel (the autotuned winner, then coordinate descent's), where every config was
    one. Read in torch 2.11 and 2.13, runtime/triton_heuristics.py: CachingAutotuner.run
    calls these once per kernel, never per launch."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    orig_precompile = CachingAutotuner.precompile
    orig_one_config = CachingAutotuner.autotune_to_one_config
    orig_coordesc = CachingAutotuner.coordinate_descent_tuning
    # Triton sharing may have wrapped them already (``*args``): its own check read them.
    if param_names(orig_precompile)[:1] not in (("warm_cache_only",), ("args",)) \
            or param_names(orig_coordesc)[:1] != ("launcher",):
        raise InductorChanged("CachingAutotuner.precompile or coordinate_descent_tuning "
                              "changed signature")

    def keep(launchers: Any) -> None:
        if isinstance(launchers, list) and len(launchers) == 1:
            key = getattr(launchers[0], "cache_hash", None)
            if isinstance(key, str):
                triton_cache.publish_kept(key)

    def precompile(self: Any, warm_cache_only: bool = False, *args: Any, **kwargs: Any) -> Any:
        result = orig_precompile(self, warm_cache_only, *args, **kwargs)
        if not warm_cache_only:
            keep(getattr(self, "launchers", None))
        return result

    def autotune_to_one_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig_one_config(self, *args, **kwargs)
        keep(getattr(self, "launchers", None))
        return result

    def coordinate_descent_tuning(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        chosen = orig_coordesc(self, launcher, *args, **kwargs)
        keep([chosen])
        return chosen

    PROCESS.ledger.patch(CachingAutotuner, "precompile", precompile)
    PROCESS.ledger.patch(CachingAutotuner, "autotune_to_one_config", autotune_to_one_config)
    PROCESS.ledger.patch(CachingAutotuner, "coordinate_descent_tuning",
                           coordinate_descent_tuning)


def _use_the_workers_ptxas() -> None:
    """Compile in this process with the ptxas Inductor's compile workers use (module
    docstring). Triton caches the version it read per process: it is read again after
    a change, so that keys name the ptxas that compiles."""
    from torch._inductor.runtime import compile_tasks

    set_path = getattr(compile_tasks, "_set_triton_ptxas_path", None)
    if set_path is None or param_names(set_path) != ():
        raise InductorChanged("torch._inductor.runtime.compile_tasks._set_triton_ptxas_path "
                              "is missing or changed signature")
    before = os.environ.get(PTXAS_VAR)
    set_path()
    if os.environ.get(PTXAS_VAR) != before:
        triton_cache.forget_ptxas_version()


def enable_kernels(ledger: Ledger, cache: CacheOpener, settings: Settings,
                   environment: Settings | None) -> bool:
    """Share compiled Triton kernels through the database where ``settings`` share
    graphs (the same keys); returns whether they are shared. Every change goes through
    the registry's ledger (``ledger``).

    Triton and Inductor's compile workers find the manager through the environment, and
    the workers build its service from TUNECACHE_* (``environment``): kernels are shared
    only where those select this process's database and keys (a cache opened with other
    arguments keeps kernels local), and never over a TRITON_CACHE_MANAGER the user set.
    """
    plan = settings.kernel_sharing()
    if plan.state not in ("publish", "verify"):
        return False
    current = os.environ.get(MANAGER_VAR)
    if current and current != triton_cache.MANAGER:
        explain_once(logging.WARNING, "tunecache: compiled kernels are not shared: %s=%s is "
                     "set (graphs and tuning are shared as usual)", MANAGER_VAR, current)
        return False
    if environment is None or environment.db_url != settings.db_url \
            or environment.kernel_sharing() != plan or environment.mode != settings.mode:
        explain_once(logging.INFO, "tunecache: compiled kernels are not shared: Inductor's "
                     "compile workers read TUNECACHE_* from the environment, which selects "
                     "another database, key or mode than this cache's")
        return False
    _install_content_names()
    _install_publish_on_choice()
    _use_the_workers_ptxas()
    triton_cache.serve()
    return True


def disable_kernels() -> bool:
    """Stop sharing kernels (the name patches are the ledger's to undo); returns whether
    they were shared. A manager the autoload hook named at ``import torch`` stays named:
    that activation is the environment's, as the hook itself is."""
    return triton_cache.stop_serving()


KERNELS = Part(enable_kernels, disable_kernels, "compiled kernels are not shared",
               "graphs and tuning are shared as usual", probe=probe_kernels)
