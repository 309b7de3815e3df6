"""Coordinate descent shared across ranks: a kernel's run adopts a stored result, claims
and tunes the kernel, or runs it untuned while a peer tunes it (and the hooks of
``autotune_to_one_config`` and ``_dynamic_scale_rblock`` that serve that plan)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...keys import to_ms
from ...patching import Ledger
from ..state import REGISTRY
from .compile_ahead import AheadCompiler, compiling_ahead, compiling_descent_ahead
from .kernel_keys import config_fields, kernel_config_problem
from .stored import FirstLaunch, decided_from, load_fn, neighbour_config

log = logging.getLogger("tunecache")

__all__ = ["DEFERRED_CHECK_SECONDS", "sharing_coordesc", "sharing_one_config",
           "keeping_hit_configs", "end_deferrals"]


def _shared_kernel(kernel: Any, ours: type) -> tuple[str, str] | None:
    """(Inductor's key, our key text) of a kernel whose autotune cache is ours, else None."""
    autotune_cache = getattr(getattr(kernel, "save_cache_hook", None), "__self__", None)
    remote = getattr(autotune_cache, "remote_cache", None)
    if autotune_cache is not None and remote and isinstance(remote, tuple) \
            and isinstance(remote[0], ours):
        return autotune_cache.remote_cache_full_key, remote[1]
    return None


def _coordesc_tunes(kernel: Any) -> bool:
    """Whether Inductor's coordinate descent would tune (and save) this kernel.

    2.13+ asks ``_should_coordesc_tune``; 2.11 returns early for template, user and
    fixed-config kernels, and those are the heuristics that property also excludes.
    """
    should = getattr(type(kernel), "_should_coordesc_tune", None)
    if isinstance(should, property):
        return bool(kernel._should_coordesc_tune)
    kind = getattr(getattr(kernel, "heuristic_type", None), "name", "")
    if kind in ("TEMPLATE", "USER_AUTOTUNE", "FIXED"):
        return False
    # 2.11 also leaves reductions alone in deterministic mode (their numerics).
    return not (getattr(kernel, "deterministic_mode", False)
                and kind in ("REDUCTION", "PERSISTENT_REDUCTION", "SPLIT_SCAN"))


def _can_defer(kernel: Any) -> bool:
    """Whether this kernel may run untuned and adopt a peer's config at a later run.

    run() calls coordinate descent again at every launch while the launcher's config is
    not ``found_by_coordesc``, except that 2.13+ then caches the launcher for a fast path
    after the first launch; with it off (``_cache_eligible``) later launches take the
    slow path again. A torch with a fast path we do not know could keep the untuned
    config for good: no deferral there. Nor under CUDA graph trees: they record a
    function's second call, so a later launch would be recorded before the peer's
    config could be compiled (which is not safe while capturing) and the graph would
    replay the untuned config for good.
    """
    if hasattr(kernel, "_cached_launcher") and not hasattr(kernel, "_cache_eligible"):
        return False
    return not _cuda_graph_trees_in_use(kernel)


def _cuda_graph_trees_in_use(kernel: Any) -> bool:
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return False
    try:
        index = int(kernel.triton_meta["device"])
        return trees.get_manager(index, create_if_none_exists=False) is not None
    except Exception:  # noqa: BLE001 - unknown: assume they are, and do not defer
        return True


# On a deferred kernel: (a Ledger of what deferring it changed on it: its
# ``_cache_eligible``; when to look for the peer's result next).
_DEFERRED = "_tunecache_deferred"
# How often a deferred kernel's runs look for the peer's result: a kernel can run
# thousands of times a second, and each look reads the database.
DEFERRED_CHECK_SECONDS = 0.1


def _capturing() -> bool:
    """Whether this thread's current CUDA stream is capturing a CUDA graph."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _same_config(a: Any, b: Any) -> bool:
    return ((a.num_warps, a.num_stages, dict(a.kwargs))
            == (b.num_warps, b.num_stages, dict(b.kwargs)))


def _bundle_winner(launcher: Any) -> None:
    """Tell Inductor's FX graph cache which compiled config of a kernel won (2.13+ bundles
    only winners into the graph's entry; earlier torch bundles every config)."""
    try:
        from torch._inductor.triton_bundler import TritonBundler

        if hasattr(TritonBundler, "put_winner"):
            TritonBundler.put_winner(launcher.cache_hash)
    except ImportError:
        pass


def _adopt(kernel: Any, launcher: Any, best: dict[str, Any], key: tuple[str, str],
           instead: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> Any | None:
    """The launcher of the stored coordinate-descent config ``best`` of ``kernel``, or
    None where this kernel could not have it or it fails to compile (one warning per
    reason; the key is refused in this process). Its first launch is guarded
    (:class:`.stored.FirstLaunch`): if it raises, ``instead(args, kwargs)`` gives the
    launcher to run, as without the entry."""
    from torch._inductor.runtime import autotune_cache as ac

    state = REGISTRY.triton
    autotune_cache = kernel.save_cache_hook.__self__
    # Inductor's own reading of a saved best config (the one a kernel load uses).
    config = ac._load_cached_autotuning(
        dict(best), autotune_cache.configs_hash, kernel.configs, kernel.inductor_meta
    )
    if config is None:
        raise ValueError("the stored config is not one of this kernel's")
    if _same_config(config, launcher.config):
        launcher.config.found_by_coordesc = True
        REGISTRY.triton_stats.add(coordesc_restored=1)
        return launcher
    # Coordinate descent changes values, never names: the kernel's constexprs are those
    # of the config it runs.
    problem = kernel_config_problem(config, [launcher.config])
    if problem is not None:
        if state is not None:
            state.refuse(*key, problem, config)
        return None
    try:
        load_fn(kernel)  # what Inductor's coordinate descent does first
        with kernel.lock:  # as Inductor's coordinate descent compiles a config
            adopted = kernel._precompile_config(config).make_launcher()
    except Exception as e:  # noqa: BLE001 - the stored config's: tune as without it
        if state is not None:
            state.stored_config_failed(*key, "compiling", e)
        return None
    adopted.config.found_by_coordesc = True
    _bundle_winner(adopted)
    REGISTRY.triton_stats.add(adopted=1)

    def launch_instead(error: BaseException, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> tuple[Any, Any]:
        if REGISTRY.triton is not None:
            REGISTRY.triton.stored_config_failed(*key, "launching", error)
        replacement = instead(args, {k: v for k, v in kwargs.items() if k != "stream"})
        kernel.launchers = [replacement]
        return replacement, replacement(*args, **kwargs)

    return FirstLaunch(kernel, adopted, launch_instead)


def sharing_coordesc(orig: Callable[..., Any], ours: type) -> Callable[..., Any]:
    """``CachingAutotuner.coordinate_descent_tuning`` through the shared cache.

    Inductor calls it at a kernel's first run (and at every run while the launcher's
    config is not ``found_by_coordesc``). Ranks run the same kernels in the same order,
    so a claim-or-wait here would only make one rank idle while the other tunes. Instead
    (:meth:`TritonCache.plan_coordesc`): a stored result is adopted; a free key is
    claimed and tuned here; a key a peer is tuning is launched with the config
    autotune_to_one_config chose, and keeps running it, while this rank goes on to the
    next kernels, until a later run finds the peer's result and adopts it. The ranks
    thus take turns along the graph and each tunes about half of its kernels, and once
    the results are in every rank runs the same configs. Inside a fusion benchmark the
    config decides a timing, so there the rank waits for the peer instead.

    It also covers hits read in compile workers: their ``found_by_coordesc`` mark does
    not survive the trip back (triton.Config.__setstate__ restores only its own fields,
    triton 3.x), so without this their first run would tune again.
    """

    def coordinate_descent_tuning(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        state = REGISTRY.triton
        # Run at every launch of a kernel coordinate descent leaves alone (templates): the
        # cheapest test first.
        if state is None or not _coordesc_tunes(self):
            return orig(self, launcher, *args, **kwargs)
        kernel = _shared_kernel(self, ours)
        if kernel is None:
            return orig(self, launcher, *args, **kwargs)
        deferred = self.__dict__.get(_DEFERRED)
        if deferred is not None:
            if _capturing():
                # CUDA graphs record this launch (cudagraph trees record a function's
                # second call): compiling the peer's config now is not safe, and the
                # recorded graph would replay whatever runs. Keep the first config.
                _end_deferral(self)
                launcher.config.found_by_coordesc = True
                REGISTRY.triton_stats.add(kept_untuned=1)
                return launcher
            if time.monotonic() < deferred[1]:
                return launcher
        waits = getattr(REGISTRY.fusion_local, "benchmarking", False) or not _can_defer(self)
        with state.attempt("sharing a Triton kernel's coordinate descent") as planning:
            action, best = state.plan_coordesc(*kernel, waits=waits)
            if action == "adopt":
                _end_deferral(self)
                adopted = _adopt(
                    self, launcher, best or {}, kernel,
                    lambda a, k: coordinate_descent_tuning(self, launcher, *a, **k))
                if adopted is not None:
                    return adopted
                action = "local"  # refused: tuned here, as without the entry
        if planning.failed:  # coordinate descent runs as usual
            state.release_claim(*kernel, planning.failure)
            _end_deferral(self)
            return orig(self, launcher, *args, **kwargs)
        if action == "defer":
            if deferred is None:
                REGISTRY.triton_stats.add(deferred=1)
                held = Ledger()  # this kernel's own: it ends with its deferral
                if hasattr(self, "_cache_eligible"):
                    held.patch(self, "_cache_eligible", False)
                deferred = (held,)
                try:
                    REGISTRY.deferred_kernels.add(self)
                except TypeError:  # not weakly referable: its deferral ends by itself
                    pass
            setattr(self, _DEFERRED, (deferred[0], time.monotonic() + DEFERRED_CHECK_SECONDS))
            return launcher
        _end_deferral(self)
        if action == "tune":
            decided = _publish_decided(self, launcher, kernel)
            if decided is not None:
                return decided
            t0 = time.perf_counter()
            transferred = _transfer(self, launcher, kernel, args, kwargs)
            REGISTRY.triton_stats.add(transfer_seconds=time.perf_counter() - t0)
            if transferred is not None:
                return transferred
        # Normally the save inside publishes it; if not (it raised, or saved nothing),
        # the key is given back now rather than make peers wait out the lease.
        ahead: AheadCompiler | None = None
        try:
            with _recording_baseline(self, kernel), \
                    compiling_descent_ahead(self, _compile_ahead_threads()) as ahead:
                winner = orig(self, launcher, *args, **kwargs)
        except BaseException as e:
            state.release_claim(*kernel, e)
            raise
        finally:
            state.drop_meta(*kernel)
            _count_ahead(ahead)
        REGISTRY.triton_stats.add(coordesc_full=1)
        state.release_claim(*kernel, "coordinate descent published no result")
        # Where this fails, our own result still runs correctly.
        with state.attempt("adopting the stored config of a Triton kernel tuned here"):
            stored = state.stored_instead(*kernel)
            if stored is not None:  # a peer's result won: run it, as every rank does
                adopted = _adopt(self, winner, stored, kernel, lambda a, k: winner)
                if adopted is not None:
                    return adopted
        return winner

    return coordinate_descent_tuning


def _compile_ahead_threads() -> int:
    """Threads that compile a kernel's candidates ahead: the compile_ahead lever, at most
    one per core."""
    state = REGISTRY.triton
    if state is None:
        return 0
    with state.attempt("reading the compile_ahead lever"):  # unread: compile as Inductor
        return min(state.cache().settings.levers.compile_ahead, os.cpu_count() or 1)
    return 0


def _count_ahead(compiler: AheadCompiler | None) -> None:
    if compiler is not None:
        REGISTRY.triton_stats.add(compiled_ahead=compiler.compiled_ahead,
                                  served_ahead=compiler.served)


@contextlib.contextmanager
def _recording_baseline(kernel: Any, key: tuple[str, str]) -> Iterator[None]:
    """Inductor's coordinate descent of ``kernel``, noting for its entry the time of the
    config it starts from (meta "baseline") and of the one it finds ("best_ms"): the
    CoordescTuner's own timings, read as its ``autotune`` returns (2.11-2.14: it is
    called with the launcher's config and no baseline timing, measures that first and
    caches every timing), before the save that publishes the entry."""
    state = REGISTRY.triton
    tuner = getattr(kernel, "coordesc_tuner", None)
    autotune = getattr(tuner, "autotune", None)
    lookup = getattr(tuner, "lookup_in_cache", None)
    if state is None or not callable(autotune) or not callable(lookup):
        yield
        return

    def recording(func: Any, baseline_config: Any, baseline_timing: Any = None,
                  *args: Any, **kwargs: Any) -> Any:
        best = autotune(func, baseline_config, baseline_timing, *args, **kwargs)
        try:
            base = to_ms(baseline_timing if baseline_timing is not None
                         else lookup(baseline_config))
            best_ms = to_ms(lookup(best))
            fields: dict[str, Any] = {}
            if math.isfinite(base):
                fields["baseline"] = {"candidate": "heuristic", "ms": base}
            if math.isfinite(best_ms):
                fields["best_ms"] = best_ms
            if fields:
                state.note_meta(*key, **fields)
        except Exception as e:  # noqa: BLE001 - meta only informs
            log.debug("tunecache: no baseline for a Triton kernel's entry: %r", e)
        return best

    with Ledger() as scoped:  # this call's own: undone when it returns
        scoped.patch(tuner, "autotune", recording)
        yield


def _transfer(kernel: Any, launcher: Any, key: tuple[str, str], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any | None:
    """The launcher of this kernel's coordinate-descent result found by transfer, or
    None: run Inductor's full descent.

    With ``Settings.transfer`` on, the stored results of the kernel's nearest
    neighbours (the same kernel at other sizes, :meth:`TritonCache.transfer_sources`)
    that this kernel can have are benchmarked with the config the descent would
    start from, the way Inductor's descent benchmarks a config (compile the config,
    ``bench`` it on this run's arguments); the fastest is saved as the descent's
    result, which publishes it under this process's claim. Where the neighbours' config
    is the one the descent starts from (their descents found nothing better), that
    config is the result. A neighbour config that fails to compile or run is skipped
    (one warning); where none could be run, or anything here fails, the full descent
    runs.
    """
    state = REGISTRY.triton
    if state is None:
        return None
    with state.attempt("starting a Triton kernel's tuning from its neighbours"):
        if not state.cache().settings.shares("transfer"):
            return None
        sources = state.transfer_sources(*key)
        candidates, agreeing = _neighbour_configs(kernel, launcher, sources)
        if not candidates and not agreeing:
            return None
        return _benchmark_and_save(kernel, launcher, key, candidates, agreeing, args,
                                   kwargs)
    state.drop_meta(*key)  # it failed: the full descent, as without transfer
    return None


def _neighbour_configs(kernel: Any, launcher: Any, sources: list[tuple[str, dict[str, Any]]]
                       ) -> tuple[list[tuple[str, Any]], list[str]]:
    """(key hash, triton.Config) of each neighbour's stored config this kernel can have,
    other than the one it starts from; and the key hashes of the neighbours whose config
    is the one it starts from."""
    autotune_cache = kernel.save_cache_hook.__self__
    out: list[tuple[str, Any]] = []
    agreeing: list[str] = []
    for key_hash, best in sources:
        config = neighbour_config(best, autotune_cache.configs_hash, kernel.configs,
                                  kernel.inductor_meta)
        if config is None or any(_same_config(config, c) for _, c in out):
            continue
        if _same_config(config, launcher.config):
            agreeing.append(key_hash)
        elif kernel_config_problem(config, [launcher.config]) is None:
            out.append((key_hash, config))
    return out, agreeing


def _publish_decided(kernel: Any, launcher: Any, key: tuple[str, str]) -> Any | None:
    """Where ``kernel`` runs the config its neighbours decided (stored.py) and this
    process holds the key's claim: that config published as the descent's result, with
    nothing measured, and its launcher; else None."""
    sources = decided_from(kernel)
    state = REGISTRY.triton
    if not sources or state is None or not kernel.save_cache_hook:
        return None
    with state.attempt("publishing the config a Triton kernel's neighbours decided"):
        state.note_meta(*key, transfer={"from": list(sources), "benchmarked": 0,
                                        "generated": 1})
        kernel.save_cache_hook(launcher.config, 0, found_by_coordesc=True)
        launcher.config.found_by_coordesc = True
        state.drop_meta(*key)
        _bundle_winner(launcher)
        REGISTRY.triton_stats.add(coordesc_decided=1)
        return launcher
    # It failed (one warning): the key is given back, and transfer or the descent decide.
    state.drop_meta(*key)
    state.release_claim(*key, "publishing a decided config failed")
    return None


def _benchmark_and_save(kernel: Any, launcher: Any, key: tuple[str, str],
                        candidates: list[tuple[str, Any]], agreeing: list[str],
                        args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any | None:
    state = REGISTRY.triton
    assert state is not None
    t0 = time.time_ns()
    load_fn(kernel)  # what Inductor's coordinate descent does first
    timed: list[tuple[float, Any]] = []
    used = list(agreeing)
    ahead: AheadCompiler | None = None
    try:
        # The neighbours' configs compile while the start config is benchmarked.
        with compiling_ahead(kernel._precompile_config, [c for _, c in candidates],
                             _compile_ahead_threads()) as ahead:
            timed.append((kernel.bench(launcher, *args, **kwargs), launcher))
            for key_hash, config in candidates:
                try:
                    with kernel.lock:  # as Inductor's coordinate descent compiles a config
                        candidate = ahead.compiled(config).make_launcher()
                    ms = kernel.bench(candidate, *args, **kwargs)
                except Exception as e:  # noqa: BLE001 - this neighbour's config fails here
                    state.transfer_config_failed(*key, e)
                    continue
                timed.append((ms, candidate))
                used.append(key_hash)
    finally:
        _count_ahead(ahead)  # once it is closed: what ran
    base_ms = timed[0][0]
    REGISTRY.triton_stats.add(transfer_benchmarks=len(timed))
    if not used:
        return None
    ms, winner = min(timed, key=lambda t: t[0])
    if not math.isfinite(to_ms(ms)):
        return None  # nothing measured (spills): the descent decides
    winner.config.found_by_coordesc = True
    fields: dict[str, Any] = {
        "best_ms": float(ms),
        "transfer": {"from": used, "benchmarked": len(timed),
                     "generated": len(candidates) + 1,
                     # Each config's time at this size: what a decision by the neighbours
                     # alone would have cost (tools/decisive_regret.py).
                     "timed": [{"config": config_fields(c.config), "ms": float(t)}
                               for t, c in timed if math.isfinite(to_ms(t))]},
    }
    if math.isfinite(to_ms(base_ms)):
        fields["baseline"] = {"candidate": "heuristic", "ms": float(base_ms)}
    from_version = state.upgraded_from(used)
    if from_version is not None:
        fields["transfer"]["from_version"] = from_version
    state.note_meta(*key, **fields)
    if kernel.save_cache_hook:
        elapsed = int(getattr(kernel, "autotune_time_taken_ns", 0) or 0) + time.time_ns() - t0
        kernel.save_cache_hook(winner.config, elapsed, found_by_coordesc=True)
    state.drop_meta(*key)
    _bundle_winner(winner)
    REGISTRY.triton_stats.add(coordesc_transferred=1)
    return winner


def sharing_one_config(orig: Callable[..., Any], ours: type) -> Callable[..., Any]:
    """``CachingAutotuner.autotune_to_one_config`` that benchmarks a kernel's configs only
    on the rank that will tune its coordinate descent.

    Inductor benchmarks a kernel's max-autotune configs at its first run and starts
    coordinate descent from the fastest. So the kernel's coordinate descent is planned
    here, before that benchmark (:meth:`TritonCache.plan_coordesc`, ``ahead``): a
    free key is claimed and the benchmark runs. Where the result will be a peer's (stored,
    or a peer holds the claim), the benchmark would only pick the config the kernel runs
    until the result is adopted; so it is skipped and the kernel's first config picked.
    Inductor's own method still runs around that pick (2.13+ prunes launchers and bundles
    the winner there): only its ``benchmark_all_configs`` is answered, on this instance
    and for this call. Should the peer die and this rank take the kernel over,
    coordinate descent starts from that first config.
    """

    def autotune_to_one_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = REGISTRY.triton
        if (state is None or not _coordesc_tunes(self)
                or not self.inductor_meta.get("coordinate_descent_tuning")):
            return orig(self, *args, **kwargs)
        kernel = _shared_kernel(self, ours)
        action = "local"  # also where planning fails: Inductor benchmarks as usual
        with state.attempt("sharing a Triton kernel's coordinate descent"):
            if kernel is not None:
                action = state.plan_coordesc(*kernel, waits=False, ahead=True)[0]
        if action in ("tune", "local"):
            try:
                return orig(self, *args, **kwargs)
            except BaseException as e:
                if kernel is not None:
                    state.release_claim(*kernel, e)
                raise
        first = self.launchers[0]
        with Ledger() as scoped:  # this call's own: undone when it returns
            scoped.patch(self, "benchmark_all_configs", lambda *_a, **_k: {
                launcher: 0.0 if launcher is first else 1.0 for launcher in self.launchers
            })
            result = orig(self, *args, **kwargs)
        REGISTRY.triton_stats.add(configs_benchmark_skipped=1)
        return result

    return autotune_to_one_config


def _end_deferral(kernel: Any) -> None:
    """Put back what deferring ``kernel`` held off (2.13+'s launcher fast path)."""
    deferred = kernel.__dict__.pop(_DEFERRED, None)
    if deferred is not None:
        try:
            REGISTRY.deferred_kernels.discard(kernel)
        except TypeError:  # never added: not weakly referable
            pass
        deferred[0].undo()


def end_deferrals() -> None:
    """End every kernel's deferral (Triton sharing is turned off): their later runs tune
    as Inductor's own, with the launcher fast path back."""
    for kernel in list(REGISTRY.deferred_kernels):
        _end_deferral(kernel)


def keeping_hit_configs(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CachingAutotuner._dynamic_scale_rblock`` that leaves a cache hit's config alone.

    2.11 adds smaller-R0_BLOCK variants of a reduction config that uses many registers
    at every precompile, a hit's single stored config included, and then benchmarks the
    two (a warm job tuned again). 2.13 returns early for a hit: the stored config was
    chosen with those variants among the candidates. This is that check.
    """

    def _dynamic_scale_rblock(self: Any, *args: Any, **kwargs: Any) -> Any:
        info = getattr(self, "autotune_cache_info", None) or {}
        if info.get("autotune_cache_state") == "hit":
            return None
        return orig(self, *args, **kwargs)

    return _dynamic_scale_rblock
