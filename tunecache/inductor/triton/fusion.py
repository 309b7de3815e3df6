"""Fusion benchmarks through the shared cache: each generated module Inductor times to
decide a fusion or a split size is measured once per cluster."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..compat import param_names
from ..state import REGISTRY, InstalledTritonCache
from .kernel_keys import fusion_benchmark_key
from .signals import PeerMeasuring, released_as, stop_unless_wanted

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...patching import Ledger

__all__ = ["install_fusion_sharing"]


def _sharing_fusion_benchmark(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``TritonScheduling.benchmark_codegened_module`` through the shared cache.

    Inductor decides a benchmarked fusion (epilogue fusion into a GEMM template under
    max-autotune, ``config.benchmark_fusion``) and the split size of a mix-order
    reduction by timing candidate kernel modules here; ``benchmark_fused_nodes``
    generates a module and calls it too (2.11-2.14). Inductor keeps each timing in a
    node-local file beside the module (``.kernel_perf``), so every new node measures
    again, and ranks measure separately and can decide differently. Here a benchmark is
    a key like any other: a stored timing is returned without running the module (its
    kernel is then neither run nor tuned); a free one is claimed, run and published; one
    a peer is running is waited for. So each module is measured once per cluster and
    every rank decides on the same timing. The decision itself stays Inductor's.
    """

    def benchmark_codegened_module(self: Any, mod: Any, *args: Any, **kwargs: Any) -> Any:
        state = REGISTRY.triton
        if state is None:
            return orig(self, mod, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            result = shared_benchmark(state, self, mod, *args, **kwargs)
        finally:
            REGISTRY.triton_stats.add(fusion_seconds=time.perf_counter() - t0)
        noted = getattr(REGISTRY.fusion_local, "decision", None)
        if noted is not None:  # a fusion decision is being made on it (decision_replay.py)
            noted.append(float(result[0]))
        return result

    def shared_benchmark(state: InstalledTritonCache, self: Any, mod: Any, *args: Any,
                         **kwargs: Any) -> Any:
        prefetching = getattr(REGISTRY.fusion_local, "prefetching", False)
        stop_unless_wanted()
        # Also where reading the timing fails: Inductor benchmarks it as usual.
        action: str = "local"
        value: Any = None  # the claim, or the stored timing
        with state.attempt("reading a fusion benchmark's timing"):
            threshold = kwargs.get("n_spills_threshold", args[0] if args else "default")
            with open(mod.__file__, encoding="utf-8") as f:
                key = fusion_benchmark_key(f.read(), threshold)
            action, value = state.fusion_timing(key, waits=not prefetching)
        if action == "done":
            REGISTRY.triton_stats.add(fusion_hits=1)
            return value, mod.__file__
        if action == "busy":
            REGISTRY.fusion_local.left_to_peer = key
            raise PeerMeasuring
        outer = getattr(REGISTRY.fusion_local, "benchmarking", False)
        REGISTRY.fusion_local.benchmarking = True
        try:
            result = orig(self, mod, *args, **kwargs)
        except BaseException as e:
            if action == "claimed":
                error, failed = released_as(e)
                state.cache().release(value, error, failed=failed)
            raise
        finally:
            REGISTRY.fusion_local.benchmarking = outer
        REGISTRY.triton_stats.add(fusion_measured=1)
        if action != "claimed":
            return result
        with state.attempt("publishing a fusion benchmark's timing") as publishing:
            # Inductor subtracts the cost of cloning mutated inputs, which can come out
            # below zero; the store holds timings >= 0, and every rank must decide on
            # the one stored, this one included.
            measured = max(0.0, float(result[0]))
            shared = state.publish_fusion_ms(key, value, measured)
            return (shared, *result[1:])
        state.cache().release(value, publishing.failure)  # our own measurement still decides
        return result

    return benchmark_codegened_module


def install_fusion_sharing(patches: Ledger) -> None:
    """Wrap TritonScheduling.benchmark_codegened_module, through ``patches``."""
    from torch._inductor.codegen.triton import TritonScheduling

    orig = TritonScheduling.__dict__.get("benchmark_codegened_module")
    if not callable(orig) or param_names(orig)[:1] != ("mod",):
        raise TypeError("TritonScheduling.benchmark_codegened_module(mod, ...) changed")
    patches.patch(TritonScheduling, "benchmark_codegened_module",
                  _sharing_fusion_benchmark(orig))
