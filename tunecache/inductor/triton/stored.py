"""Where a stored config becomes a kernel's: refused at the kernel's load if the kernel
could not have it, and given up for Inductor's own tuning if it fails to compile or launch.

A kernel load (``check_autotune_cache``, in a compile worker or here) asks
``AutotuneCache.read_best(inductor_meta, configs)`` for the kernel's best config; a hit
replaces the kernel's configs with that one. ``read_best`` is wrapped
(:func:`checking_read_best`): the config must be one the kernel could have
(:func:`.keys.kernel_config_problem`: its own constexpr names and types, Inductor's
limits), else it is refused with one warning per reason and the load is a miss. A
config it lets through is marked on the kernel's AutotuneCache with the kernel's own
configs (the mark travels back from a compile worker with the pickled kernel).

On a miss, with ``Settings.decisive``'s ``triton`` part, a kernel whose nearest neighbours
all found one config loads that config the same way (:func:`_decided_by_neighbours`), so a
compile worker compiles it alone; its first run publishes it (coordesc.py).

A stored config can still fail on this GPU (a ptxas or register limit, a launch the
driver refuses). ``CachingAutotuner.precompile`` is wrapped (:func:`falling_back_precompile`,
in compile workers too, where kernels compile): if the marked kernel's compile raises,
the kernel gets its own configs back, as if the load had missed, and compiles those. Its
launcher is wrapped until its first launch succeeds (:class:`FirstLaunch`); a first
launch that raises does the same, then runs the kernel as Inductor's first run does
(benchmarks its configs, coordinate descent). In both cases the key is refused in this
process from then on (remote.py). An error raised by the kernel's own configs is the
job's, as without tunecache: nothing catches it.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from ..state import REGISTRY
from .kernel_keys import CONFIG_FIELDS, kernel_config_problem

__all__ = ["checking_read_best", "decided_from", "falling_back_precompile", "FirstLaunch",
           "neighbour_config"]

# On an AutotuneCache whose read_best returned a stored config: the kernel's own configs.
_OWN_CONFIGS = "_tunecache_own_configs"
# ... and where that config was decided by the kernel's neighbours: their key hashes.
_DECIDED_FROM = "_tunecache_decided_from"


def _our_key(autotune_cache: Any, ours: type | None = None) -> tuple[str, str] | None:
    """(Inductor's key, our key text) of an AutotuneCache whose remote cache is ours."""
    remote = getattr(autotune_cache, "remote_cache", None)
    if not (remote and isinstance(remote, tuple)):
        return None
    if ours is not None and not isinstance(remote[0], ours):
        return None
    return autotune_cache.remote_cache_full_key, remote[1]


def checking_read_best(orig: Callable[..., Any], ours: type) -> Callable[..., Any]:
    """``AutotuneCache.read_best`` that refuses a config the kernel could not have."""

    def read_best(self: Any, inductor_meta: Any, configs: Any) -> Any:
        best = orig(self, inductor_meta, configs)
        state = REGISTRY.triton
        key = None if state is None else _our_key(self, ours)
        if key is None or state is None:
            return best
        own = list(configs or ())
        if best is None:
            served = state.served(key[1])
            if served is not None:
                # Ours was read and Inductor did not take it: not a hit, and said once.
                state.refuse(*key, _not_taken(served, self.configs_hash, own), served)
                return None
            return _decided_by_neighbours(self, key, inductor_meta, own)
        with state.attempt("checking a stored Triton config") as checking:
            problem = kernel_config_problem(best, own)
        if checking.failed:  # unsure: Inductor tunes the kernel
            return None
        if problem is not None:
            state.refuse(*key, problem, best)
            return None
        self.__dict__[_OWN_CONFIGS] = own
        return best

    return read_best


def _not_taken(served: dict[str, Any], configs_hash: str, own: list[Any]) -> str:
    """Why Inductor's ``_load_cached_autotuning`` returned nothing for a stored config we
    served: another config list's hash, a config the kernel could not have, or one that
    this torch does not load (2.11 and 2.12 load only one of the kernel's own configs or,
    with coordinate descent on, a descent's result; 2.13 rebuilds any)."""
    if served.get("configs_hash") != configs_hash:
        return "its configs hash is not this kernel's"
    config = types.SimpleNamespace(
        kwargs={k: v for k, v in served.items() if k not in CONFIG_FIELDS},
        num_warps=served.get("num_warps"), num_stages=served.get("num_stages"))
    return (kernel_config_problem(config, own)
            or "neither one of the kernel's own configs nor a coordinate-descent result "
               "for it, the only configs this torch's Inductor loads")


def _decided_by_neighbours(autotune_cache: Any, key: tuple[str, str], inductor_meta: Any,
                           own: list[Any]) -> Any:
    """On a miss: the config this kernel's neighbours all found
    (:meth:`.remote.TritonCache.decided_by_neighbours`), read as Inductor reads a stored
    one, or None. Only for a kernel that coordinate descent tunes: its first run, where
    the descent would be, publishes the config under a claim or adopts a peer's
    (coordesc.py); until then it is not ``found_by_coordesc``."""
    state = REGISTRY.triton
    if state is None or not (inductor_meta or {}).get("coordinate_descent_tuning"):
        return None
    with state.attempt("reading the config a Triton kernel's neighbours decided"):
        decided = state.decided_by_neighbours(*key)
        if decided is None:
            return None
        best, sources = decided
        config = neighbour_config(best, autotune_cache.configs_hash, own, inductor_meta)
        if config is None or kernel_config_problem(config, own) is not None:
            return None
        config.found_by_coordesc = False
        autotune_cache.__dict__[_OWN_CONFIGS] = own
        autotune_cache.__dict__[_DECIDED_FROM] = sources
        return config
    return None  # it failed (one warning): a miss, as without the neighbours


def neighbour_config(best: dict[str, Any], configs_hash: str, configs: list[Any],
                     inductor_meta: Any) -> Any:
    """A neighbour's stored best config read for this kernel as Inductor reads a stored
    one (``_load_cached_autotuning``), or None. The stored configs hash is the
    neighbour's own list's, which differs at other sizes: this kernel's stands in."""
    from torch._inductor.runtime import autotune_cache as ac

    return ac._load_cached_autotuning({**best, "configs_hash": configs_hash}, configs_hash,
                                      configs, inductor_meta)


def decided_from(kernel: Any) -> list[str] | None:
    """The neighbours' key hashes where ``kernel`` loaded a config they decided
    (:func:`_decided_by_neighbours`) and still runs it, else None."""
    autotune_cache = getattr(getattr(kernel, "save_cache_hook", None), "__self__", None)
    return getattr(autotune_cache, "__dict__", {}).get(_DECIDED_FROM)


def _stored_hit(kernel: Any) -> tuple[list[Any], Any] | None:
    """(the kernel's own configs, its AutotuneCache) where it runs a stored config."""
    info = getattr(kernel, "autotune_cache_info", None) or {}
    if info.get("autotune_cache_state") != "hit":
        return None
    autotune_cache = getattr(getattr(kernel, "save_cache_hook", None), "__self__", None)
    own = getattr(autotune_cache, "__dict__", {}).get(_OWN_CONFIGS)
    return None if not own else (own, autotune_cache)


def load_fn(kernel: Any) -> None:
    """Load the kernel's Triton function where a compile worker sent it without one (what
    Inductor's coordinate descent does before it compiles a config)."""
    ensure_loaded = getattr(kernel, "_ensure_kernel_loaded", None)
    if ensure_loaded is not None:
        ensure_loaded()
    elif kernel.fn.fn is None:  # 2.11
        kernel.fn = kernel._reload_kernel().fn


def _give_way(kernel: Any, own: list[Any], autotune_cache: Any, doing: str,
              error: BaseException) -> None:
    """Put the kernel back as Inductor loads it without an entry: its own configs, nothing
    compiled, a miss; the key refused in this process (one warning per ``doing``)."""
    state = REGISTRY.triton
    key = _our_key(autotune_cache)
    if state is not None and key is not None:
        state.stored_config_failed(*key, doing, error)
    autotune_cache.__dict__.pop(_OWN_CONFIGS, None)
    autotune_cache.__dict__.pop(_DECIDED_FROM, None)
    kernel.configs = list(own)
    kernel.compile_results = []
    kernel.launchers = []
    if "_cached_launcher" in kernel.__dict__:  # 2.13+'s fast path
        kernel._cached_launcher = None
    info = {"autotune_cache_state": "miss", "num_configs": len(own)}
    if (getattr(kernel, "inductor_meta", None) or {}).get("coordinate_descent_tuning"):
        info["coordesc_tuning"] = True
    kernel.autotune_cache_info = info
    if getattr(getattr(kernel, "fn", None), "fn", 0) is None:
        load_fn(kernel)


def _run_as_inductor(kernel: Any, own: list[Any], autotune_cache: Any, error: BaseException,
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """After the stored config's first launch raised: Inductor's first run of the kernel
    on its own configs (compile, benchmark, coordinate descent, launch)."""
    _give_way(kernel, own, autotune_cache, "launching", error)
    # run() is inside its launch: its profiler context and debug record are the outer
    # run's, which exits them; the inner run keeps its own.
    outer = {k: kernel.__dict__[k] for k in ("_profiler_ctx", "_debug_call")
             if k in kernel.__dict__}
    kernel.__dict__.update(dict.fromkeys(outer))
    try:
        result = kernel.run(*args, **kwargs)
    finally:
        kernel.__dict__.update(outer)
    return kernel.launchers[0], result


class FirstLaunch:
    """A stored config's launcher until it has launched once. Everything but the call is
    the launcher's (run() reads its config, cache hash, ...). If the first launch raises,
    ``fallback(error, args, kwargs)`` returns (the launcher to use, the launch's result).
    After a first launch that succeeded, the kernel's launcher is the plain one again."""

    def __init__(self, kernel: Any, launcher: Any,
                 fallback: Callable[[BaseException, tuple[Any, ...], dict[str, Any]],
                                    tuple[Any, Any]]) -> None:
        vars(self).update(_kernel=kernel, _launcher=launcher, _fallback=fallback)

    def __getattr__(self, name: str) -> Any:
        return getattr(vars(self)["_launcher"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(vars(self)["_launcher"], name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fallback = vars(self)["_fallback"]
        kernel = vars(self)["_kernel"]
        if fallback is None:
            # run() (2.13+) kept this wrapper for its fast path after the first launch:
            # let it keep the launcher itself from the next launch on.
            if kernel.__dict__.get("_cached_launcher") is self:
                kernel._cached_launcher = None
            return vars(self)["_launcher"](*args, **kwargs)
        vars(self)["_fallback"] = None
        try:
            result = vars(self)["_launcher"](*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the stored config's: Inductor's own path
            launcher, result = fallback(e, args, kwargs)
            vars(self)["_launcher"] = launcher
            return result
        launchers = kernel.__dict__.get("launchers")
        if launchers and launchers[0] is self:
            kernel.launchers = [vars(self)["_launcher"]]
        return result


def falling_back_precompile(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CachingAutotuner.precompile`` that gives up a stored config which fails to
    compile (or to load as a launcher) for the kernel's own configs, and guards its first
    launch (:class:`FirstLaunch`)."""

    def precompile(self: Any, *args: Any, **kwargs: Any) -> Any:
        hit = _stored_hit(self)
        if hit is None:
            return orig(self, *args, **kwargs)
        try:
            result = orig(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the stored config's: compile the own ones
            _give_way(self, *hit, "compiling", e)
            return orig(self, *args, **kwargs)
        launchers = self.__dict__.get("launchers")
        if launchers and len(launchers) == 1 and not isinstance(launchers[0], FirstLaunch):
            self.launchers = [FirstLaunch(self, launchers[0],
                                          functools.partial(_run_as_inductor, self, *hit))]
        return result

    return precompile
