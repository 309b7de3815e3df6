"""The split-size search of a mix-order reduction, split across ranks: each rank measures
the candidate values its peers are not measuring."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..state import REGISTRY
from .kernel_keys import fusion_ms_from_entry
from .signals import NoLongerWanted, PeerMeasuring, stop_unless_wanted

__all__ = ["SPLIT_STEPS_AHEAD", "splitting_single_field", "stopping_unwanted"]


# How many values past the one a peer is measuring a split-size search may look for a
# free one to measure meanwhile (:func:`splitting_single_field`): one is enough for two
# ranks; more ranks measuring the same search find the next ones taken.
SPLIT_STEPS_AHEAD = 4


def splitting_single_field(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CoordescTuner.autotune_single_field`` split across ranks.

    Inductor searches a mix-order reduction's split size with it (2.11-2.14, under
    max-autotune): each candidate value is a kernel module generated, tuned (coordinate
    descent) and benchmarked through ``benchmark_codegened_module``, one after another.
    Its first round always measures ``init // 2``, ``init`` and ``init * 2`` (clamped):
    those are measured first here, skipping any a peer is measuring (each rank takes the
    next free one). Then Inductor's own search runs over the timings, reading the peers'
    from the store. Each later round measures one new value ``v``, a step further from
    ``init`` than the best so far ``p``, and goes on to the next step only if ``v`` beats
    ``p``, so the rounds are a chain. Where a peer is measuring ``v``, this rank measures
    the next step meanwhile (:data:`SPLIT_STEPS_AHEAD`), and stops that measurement (at
    its next coordinate-descent benchmark) once ``v``'s timing is in and does not beat
    ``p``'s. The timings, hence the result, are the ones every rank reads.
    """

    def autotune_single_field(fn: Callable[[Any], Any], init_val: Any,
                              min_val: Any = None, max_val: Any = None) -> Any:
        if REGISTRY.triton is None or getattr(REGISTRY.fusion_local, "prefetching", False):
            return orig(fn, init_val, min_val, max_val)
        search = _SplitSizeSearch(fn, init_val, min_val, max_val)
        search.first_round()
        return orig(search.timing, init_val, min_val, max_val)

    return autotune_single_field


class _SplitSizeSearch:
    """The timings one split-size search runs on (:func:`splitting_single_field`):
    ``fn`` measures a value (a fusion benchmark, through the shared cache)."""

    def __init__(self, fn: Callable[[Any], Any], init_val: Any, min_val: Any,
                 max_val: Any) -> None:
        self.fn = fn
        self.init = init_val
        self.low = 1 if min_val is None else min_val
        self.high = 2**30 if max_val is None else max_val
        self.measured: dict[Any, Any] = {}  # by this rank, before the search asked
        self.seen: dict[Any, Any] = {}  # every timing the search was given

    def _clamp(self, value: Any) -> Any:
        return min(max(value, self.low), self.high)

    def first_round(self) -> None:
        for value in dict.fromkeys(self._clamp(v)
                                   for v in (self.init // 2, self.init, self.init * 2)):
            if self._measure_unless_busy(value) is not None:
                REGISTRY.triton_stats.add(fusion_left_to_peer=1)

    def timing(self, value: Any) -> Any:
        """The timing of ``value``, for Inductor's search."""
        if value not in self.measured:
            busy = self._measure_unless_busy(value)
            if busy is not None and value != self.init:
                self._measure_ahead(value, busy)
        self.seen[value] = self.measured[value] if value in self.measured else self.fn(value)
        return self.seen[value]

    def _measure_ahead(self, value: Any, busy: Mapping[str, Any]) -> None:
        """While a peer measures ``value`` (its benchmark's key ``busy``), measure the
        search's next value in the same direction, the first that is free."""
        best = min(self.seen.values(), default=None)  # the timing value must beat
        if best is None:
            return

        peers_ms: float | None = None  # the peer's timing once in: read (and counted) once

        def wanted() -> bool:
            nonlocal peers_ms
            if peers_ms is None:
                peers_ms = _peers_timing(busy)
            return peers_ms is None or peers_ms < best

        ahead = value
        for _ in range(SPLIT_STEPS_AHEAD):
            further = self._clamp(ahead // 2 if value < self.init else ahead * 2)
            if further == ahead or further in self.measured:
                return
            ahead = further
            if self._measure_unless_busy(ahead, wanted) is None:
                if ahead in self.measured:
                    REGISTRY.triton_stats.add(split_values_ahead=1)
                return

    def _measure_unless_busy(self, value: Any,
                             wanted: Callable[[], bool] | None = None) -> Any:
        """Measure ``value`` into ``measured``; the key of its fusion benchmark if a peer
        is measuring it instead; None if it raised or was stopped as no longer wanted."""
        REGISTRY.fusion_local.prefetching = True
        REGISTRY.fusion_local.left_to_peer = None
        REGISTRY.fusion_local.wanted = wanted
        try:
            timing = self.fn(value)
        except PeerMeasuring:
            pass
        except NoLongerWanted:
            REGISTRY.triton_stats.add(split_values_stopped=1)
            return None
        except Exception:  # noqa: BLE001 - Inductor's own call raises it, if it asks
            return None
        finally:
            REGISTRY.fusion_local.prefetching = False
            REGISTRY.fusion_local.wanted = None
        # Checked apart from the exception, in case code between fn and the benchmark
        # turned it into a timing.
        if REGISTRY.fusion_local.left_to_peer is not None:
            return REGISTRY.fusion_local.left_to_peer
        self.measured[value] = timing
        return None


def _peers_timing(key: Mapping[str, Any]) -> float | None:
    """The stored timing of the fusion benchmark ``key`` a peer is measuring; None while it
    is not in, or cannot be read."""
    try:
        answer = REGISTRY.triton.cache().lookup(key) if REGISTRY.triton is not None else None
    except Exception:  # noqa: BLE001 - not known: go on measuring
        return None
    return None if answer is None else fusion_ms_from_entry(answer.timings)


def stopping_unwanted(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CoordescTuner.call_func`` (one coordinate-descent benchmark) that first stops a
    split-size value measured ahead which the search no longer wants
    (:func:`splitting_single_field`): coordinate descent is most of such a value's
    measurement, and the benchmarks are where it can stop."""

    def call_func(self: Any, func: Any, config: Any) -> Any:
        stop_unless_wanted()
        return orig(self, func, config)

    return call_func
