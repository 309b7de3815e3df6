"""Installing and removing Triton sharing: Inductor's remote autotune cache, the re-keyed
``AutotuneCache.create``, and the runtime hooks on CachingAutotuner, CoordescTuner and
TritonScheduling, each set through the registry's patch ledger so that it can be put
back."""

from __future__ import annotations

import atexit
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import keys as tc_keys
from ...parts import Part
from ...process import PROCESS
from ..compat import InductorChanged, kept_off, param_names, require, turn_on, warn_off
from ..state import REGISTRY, InstalledTritonCache
from .candidates import install_candidate_skip
from .coordesc import end_deferrals, keeping_hit_configs, sharing_coordesc, sharing_one_config
from .decision_replay import install_decision_replay
from .fusion import install_fusion_sharing
from .kernel_keys import triton_kernel_info
from .remote import TritonCache, remote_cache_class
from .split import splitting_single_field, stopping_unwanted
from .stored import checking_read_best, falling_back_precompile
from .worker import workers_read_cache

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...opener import CacheOpener
    from ...patching import Ledger
    from ...settings import Settings

__all__ = ["TRITON", "FUSION", "enable_triton", "disable_triton", "enable_fusion"]

log = logging.getLogger("tunecache")

# Notes on the hooks. Everything in the triton package serves one aim: the best config of
# every Triton kernel that Inductor autotunes (pointwise, reduction, template ...; the
# autotune_to_one_config benchmark and coordinate descent) goes through the shared cache.
# docs/triton-autotune.md has the reasoning; the facts it rests on (torch 2.13,
# torch/_inductor/runtime/autotune_cache.py and triton_heuristics.py, checked against
# 2.11's sources):
#
# * Inductor keeps one ``AutotuneCache`` per kernel module. ``check_autotune_cache`` calls
#   ``AutotuneCache.create(inductor_meta, filename, configs_hash)`` when the kernel is
#   loaded, then ``read_best`` -> remote ``get``; ``CachingAutotuner`` calls
#   ``save_cache_hook`` (``AutotuneCache.save`` -> remote ``put``) at the kernel's first
#   run, after autotune_to_one_config and again after coordinate descent.
# * The remote cache is whatever class ``torch._inductor.remote_cache`` exports under the
#   name ``RemoteAutotuneCache`` (``create_cache`` looks it up by name), and it is used
#   when the kernel's ``inductor_meta["autotune_remote_cache"]`` (from
#   ``config.autotune_remote_cache`` at code generation) is true.
# * With parallel compile (the default), kernels load in compile-worker subprocesses;
#   the AutotuneCache built there travels back to the compiling process inside the
#   pickled kernel (CachingAutotuner.__getstate__ keeps save_cache_hook), and the save
#   happens there, at the kernel's first run. Workers start with the parent's environment
#   (SubprocPool, python_subprocess_env), so where tunecache was activated by
#   TUNECACHE_DB and its ``torch.backends`` entry point is installed, the entry point
#   runs in each worker too and :func:`enable_triton_from_env` plugs the cache in when
#   ``torch._inductor.runtime.autotune_cache`` is imported there (tunecache._autoload).
#   Otherwise (explicit enable() with other settings, or autoload off) the workers could
#   not read the cache and Inductor would try its own Redis class: we then set
#   ``config.compile_threads = 1`` so that every kernel loads in this process.
# * Loads never wait. Inductor autotunes a kernel at its first run, after the whole graph
#   has compiled, so a load that waited for a peer's claim would stall this rank's compile
#   until the peer ran its graph, and two ranks holding each other's claims would both
#   stall for the whole lease. The claim comes at the first run, around coordinate
#   descent (_sharing_coordesc), where ranks split the kernels between them. Other saves
#   claim and publish at once; the first publish of a key wins (entries are immutable).
# * Inductor's remote key hashes the kernel source, and the source embeds
#   ``DeviceProperties(type='cuda', index=N, ...)``: rank N's key would differ from rank
#   M's for the same kernel. ``AutotuneCache.create`` is wrapped to re-key our remote
#   cache with the source hashed without the device index and without the kernel's
#   per-graph number (triton_poi_fused_add_3), which shifts when fusion differs earlier
#   in the graph (torch 2.11: 8 of 13 warm misses of a two-rank job before this).
# * Fusion decisions and the split size of a mix-order reduction are decided by timing
#   generated modules with ``TritonScheduling.benchmark_codegened_module`` (2.11-2.14);
#   the split size by ``CoordescTuner.autotune_single_field``, a search whose first round
#   always measures init // 2, init and init * 2, in simd.py's _codegen_mix_order_reduction
#   (most of the Triton tuning of a llama block). Both are wrapped; Inductor
#   still makes every decision, from the shared timings. A fusion candidate whose timing
#   is stored is not even compiled (``Scheduler.compile_kernel`` -> ``AsyncCompile.triton``,
#   triton/candidates.py).
# * 2.11's ``CachingAutotuner._dynamic_scale_rblock`` re-expands a cache hit's reduction
#   config at precompile, so a warm job benchmarked again; 2.13 returns early for a hit
#   (``autotune_cache_info["autotune_cache_state"] == "hit"``), and so do we.


def ensure_runtime_hooks(ours: type) -> None:
    """Install the runtime hooks (:func:`_install_runtime_hooks`) that this process needs
    and does not have yet, once CachingAutotuner exists: in a compile worker only the
    stored-config checks (it loads and compiles kernels; no runs, no benchmarks), in the
    compiling process all of them (:func:`_compiling` asks again once the GEMM part is on).

    Triton sharing can be enabled inside the import of triton_heuristics itself (it
    imports autotune_cache, whose import the autoload hook watches), before the class
    exists; then this waits for the first kernel load in this process (create()), which
    runs triton_heuristics code. Usually the class exists by the time the GEMM part is
    on (select_algorithm imports it), and it must be there by then: with parallel compile
    the first in-process kernel load can come after the forward graph's first run, whose
    kernels would otherwise all be tuned on every rank (seen in a two-rank job).
    """
    state = REGISTRY.triton
    if state is None:
        return
    wanted = _WORKER_HOOKS if state.worker else _ALL_HOOKS
    if wanted <= REGISTRY.runtime_hooks:
        return
    th = sys.modules.get("torch._inductor.runtime.triton_heuristics")
    if th is None or getattr(th, "CachingAutotuner", None) is None:
        return
    with REGISTRY.runtime_hooks_lock:
        missing = wanted - REGISTRY.runtime_hooks
        REGISTRY.runtime_hooks |= missing
        if missing:
            _install_runtime_hooks(th.CachingAutotuner, ours, state, missing)


_STORED = "checking stored configs"
_WORKER_HOOKS = frozenset({_STORED})
_ALL_HOOKS = frozenset({_STORED, "sharing coordinate descent",
                        "leaving a peer's kernels unbenchmarked",
                        "keeping stored reduction configs", "splitting the split-size search"})


def _install_runtime_hooks(cls: type, ours: type, state: InstalledTritonCache,
                           which: frozenset[str]) -> None:
    """Wrap, each on its own (one that fails leaves the others in place):
    ``CachingAutotuner.coordinate_descent_tuning`` (:func:`sharing_coordesc`),
    ``CachingAutotuner.autotune_to_one_config`` (:func:`sharing_one_config`),
    ``CachingAutotuner._dynamic_scale_rblock`` (:func:`keeping_hit_configs`),
    ``CoordescTuner.autotune_single_field`` (:func:`splitting_single_field`, with
    ``CoordescTuner.call_func``: :func:`stopping_unwanted`), and ``AutotuneCache.read_best``
    with ``CachingAutotuner.precompile`` (:mod:`.stored`; the only ones in a compile
    worker)."""

    def stored_configs() -> None:
        from torch._inductor.runtime.autotune_cache import AutotuneCache

        orig = AutotuneCache.__dict__.get("read_best")
        if not callable(orig) or param_names(orig) != ("inductor_meta", "configs"):
            raise InductorChanged("AutotuneCache.read_best(inductor_meta, configs) changed")
        precompile = cls.__dict__.get("precompile")
        if not callable(precompile):
            raise InductorChanged("CachingAutotuner.precompile changed")
        _replace(AutotuneCache, "read_best", checking_read_best(orig, ours))
        _replace(cls, "precompile", falling_back_precompile(precompile))

    def coordesc() -> None:
        orig = cls.__dict__.get("coordinate_descent_tuning")
        if not callable(orig) or param_names(orig)[:1] != ("launcher",):
            raise InductorChanged(
                "CachingAutotuner.coordinate_descent_tuning(launcher, ...) changed")
        _replace(cls, "coordinate_descent_tuning", sharing_coordesc(orig, ours))

    def one_config() -> None:
        orig = cls.__dict__.get("autotune_to_one_config")
        if not callable(orig) or "benchmark_all_configs" not in cls.__dict__:
            raise InductorChanged("CachingAutotuner.autotune_to_one_config changed")
        _replace(cls, "autotune_to_one_config", sharing_one_config(orig, ours))

    def rblock() -> None:
        orig = cls.__dict__.get("_dynamic_scale_rblock")
        if not callable(orig) or param_names(orig) != ():
            raise InductorChanged("CachingAutotuner._dynamic_scale_rblock() changed")
        _replace(cls, "_dynamic_scale_rblock", keeping_hit_configs(orig))

    def single_field() -> None:
        from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

        orig = CoordescTuner.__dict__.get("autotune_single_field")
        if not isinstance(orig, staticmethod) or param_names(orig.__func__) != (
            "fn", "init_val", "min_val", "max_val"
        ):
            raise InductorChanged(
                "CoordescTuner.autotune_single_field(fn, init_val, ...) changed")
        _replace(CoordescTuner, "autotune_single_field",
                 staticmethod(splitting_single_field(orig.__func__)))
        orig = CoordescTuner.__dict__.get("call_func")
        if not callable(orig) or param_names(orig) != ("func", "config"):
            raise InductorChanged("CoordescTuner.call_func(func, config) changed")
        _replace(CoordescTuner, "call_func", stopping_unwanted(orig))

    for what, hook in ((_STORED, stored_configs),
                       ("sharing coordinate descent", coordesc),
                       ("leaving a peer's kernels unbenchmarked", one_config),
                       ("keeping stored reduction configs", rblock),
                       ("splitting the split-size search", single_field)):
        if what not in which:
            continue
        try:
            hook()
        except Exception as e:  # noqa: BLE001 - that part runs as Inductor's own
            REGISTRY.triton_stats.add(errors=1)  # counted with the adapter's failures
            warn_off(f"Triton sharing is on without {what}", e, "Inductor does that as usual")


def _replace(owner: type, name: str, value: Any) -> None:
    PROCESS.ledger.patch(owner, name, value)  # disable() undoes it


def rekey_create(orig: Callable[..., Any], ours: type) -> Callable[..., Any]:
    """``AutotuneCache.create``, re-keying our remote cache without the device index."""

    def create(inductor_meta: Any, filename: str, configs_hash: str) -> Any:
        ensure_runtime_hooks(ours)
        cache = orig(inductor_meta, filename, configs_hash)
        remote = getattr(cache, "remote_cache", None)
        if remote and isinstance(remote, tuple) and isinstance(remote[0], ours):
            try:
                with open(filename, encoding="utf-8") as f:
                    source = f.read()
                info = triton_kernel_info(source, inductor_meta or {})
                cache.remote_cache = (remote[0], tc_keys.canonical_json(info))
            except Exception as e:  # noqa: BLE001 - Inductor's own key still works
                if REGISTRY.triton is not None:
                    REGISTRY.triton.warn_once("keying a Triton kernel without its device index", e)
        return cache

    return create


def probe_triton() -> None:
    """Raise :class:`InductorChanged` where what Triton config sharing plugs into differs
    (the runtime hooks check theirs as they install: :func:`ensure_runtime_hooks`)."""
    from torch._inductor import config
    from torch._inductor import remote_cache as rc
    from torch._inductor.runtime import autotune_cache as ac

    create = ac.AutotuneCache.__dict__.get("create")
    require(
        ("remote_cache.RemoteAutotuneCache", hasattr(rc, "RemoteAutotuneCache")),
        ("remote_cache.RemoteCache", hasattr(rc, "RemoteCache")),
        ("remote_cache.RemoteCachePassthroughSerde", hasattr(rc, "RemoteCachePassthroughSerde")),
        ("AutotuneCache.create", isinstance(create, staticmethod)),
        ("config.autotune_remote_cache", hasattr(config, "autotune_remote_cache")),
        ("config.compile_threads", hasattr(config, "compile_threads")),
    )
    if param_names(create.__func__) != ("inductor_meta", "filename", "configs_hash"):
        raise InductorChanged("AutotuneCache.create(inductor_meta, filename, configs_hash) "
                              "changed")


def enable_triton(ledger: Ledger, cache: CacheOpener, settings: Settings,
                  environment: Settings | None) -> bool:
    """Plug tunecache in as Inductor's remote autotune cache (see the notes above) where
    ``settings`` share Triton configs; returns whether it is. Every change goes through
    ``ledger``. It starts as a compile worker's (reads only, the stored-config checks);
    :func:`_compiling` makes it the compiling process's once the GEMM part is on."""
    if not settings.shares("triton"):
        return False
    from torch._inductor import config
    from torch._inductor import remote_cache as rc
    from torch._inductor.runtime import autotune_cache as ac

    probe_triton()
    create = ac.AutotuneCache.__dict__["create"]
    if kept_off(config, "autotune_remote_cache"):  # TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=0
        return False
    ours = remote_cache_class()
    REGISTRY.triton = TritonCache(cache, worker=True)
    ledger.patch(rc, "RemoteAutotuneCache", ours)
    ledger.patch(ac.AutotuneCache, "create", staticmethod(rekey_create(create.__func__, ours)))
    turn_on(ledger, config, "autotune_remote_cache")
    ensure_runtime_hooks(ours)
    if not REGISTRY.triton_atexit:
        REGISTRY.triton_atexit = True
        atexit.register(flush_triton)
    return True


def _compiling(ledger: Ledger, settings: Settings, environment: Settings | None) -> None:
    """Triton sharing in the compiling process: it claims, publishes and holds results
    (not a compile worker's reads only), with every runtime hook; and where Inductor's
    compile workers cannot read the shared cache, kernels load in this process."""
    from torch._inductor import config

    state = REGISTRY.triton
    if state is None:
        return
    state.worker = False
    ensure_runtime_hooks(remote_cache_class())
    if config.compile_threads != 1 and not workers_read_cache(settings, environment):
        ledger.patch(config, "compile_threads", 1)
        log.info(
            "tunecache: set torch._inductor.config.compile_threads=1, so that Triton "
            "kernels load (and read the shared autotune cache) in this process: "
            "compile workers only reach it when TUNECACHE_DB names this database and "
            "tunecache's torch.backends entry point is installed (docs/triton-autotune.md)"
        )


def probe_fusion() -> None:
    """Raise :class:`InductorChanged` where the scheduler methods fusion sharing wraps
    are missing or take other leading parameters (each piece checks the rest)."""
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.scheduler import Scheduler

    for what, fn, lead in (
            ("TritonScheduling.benchmark_codegened_module",
             TritonScheduling.__dict__.get("benchmark_codegened_module"), ("mod",)),
            ("Scheduler.speedup_by_fusion", Scheduler.__dict__.get("speedup_by_fusion"),
             ("node1", "node2")),
            ("Scheduler.compile_kernel", Scheduler.__dict__.get("compile_kernel"), ("nodes",)),
            ("AsyncCompile.triton", AsyncCompile.__dict__.get("triton"),
             ("kernel_name", "source_code"))):
        if not callable(fn) or param_names(fn)[:len(lead)] != lead:
            raise InductorChanged(f"{what}({', '.join(lead)}, ...) changed")


def enable_fusion(ledger: Ledger, cache: CacheOpener, settings: Settings,
                  environment: Settings | None) -> bool:
    """Fusion and split-size benchmark timings, the candidates they spare, and epilogue-
    fusion decisions through the shared cache, where Triton configs are shared (only the
    compiling process benchmarks fusions); returns whether they are."""
    if REGISTRY.triton is None:
        return False
    probe_fusion()
    install_fusion_sharing(ledger)
    _install_part(ledger, install_candidate_skip, "fusion candidates with a stored "
                  "timing are still compiled")
    _install_part(ledger, install_decision_replay, "epilogue-fusion decisions are "
                  "not shared")
    return True


def _install_part(ledger: Ledger, install: Callable[[Ledger], None], off: str) -> bool:
    """One optional piece of fusion sharing; one that fails is undone, and warned of."""
    mark = ledger.mark()
    try:
        install(ledger)
        return True
    except Exception as e:  # noqa: BLE001 - that piece runs as Inductor's own
        ledger.undo(mark)
        warn_off(off, e)
        return False


def disable_triton() -> bool:
    """Stop Triton sharing: drop the adapter (flushing what it holds) and end
    coordinate-descent deferrals; returns whether it was on. What it patched is the
    ledger's to undo, with the rest (:func:`tunecache.disable`), or back to the mark
    where enabling it failed half-way."""
    state, REGISTRY.triton = REGISTRY.triton, None
    REGISTRY.runtime_hooks = set()
    end_deferrals()
    if state is None:
        return False
    state.flush()
    return True


def _no_state() -> bool:
    return False  # fusion sharing holds nothing but its patches, which are the ledger's


TRITON = Part(enable_triton, disable_triton, "Triton kernel autotuning is not shared",
              "GEMM autotuning is", compiling=_compiling, probe=probe_triton)
FUSION = Part(enable_fusion, _no_state, "fusion benchmark timings are not shared",
              "Triton configs are", probe=probe_fusion)


def flush_triton() -> None:
    state = REGISTRY.triton
    if state is not None:
        try:
            state.flush()
        except Exception:  # noqa: BLE001 - never fail interpreter shutdown
            pass
