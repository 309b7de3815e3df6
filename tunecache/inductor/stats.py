"""Counters of what the Inductor hooks did in this process: :class:`Stats` for GEMM
autotuning, :class:`TritonStats` for Triton kernels and fusion benchmarks.

The one instance of each is owned by the hook registry (:mod:`tunecache.inductor.state`);
``tunecache.stats()`` returns copies of them beside the other parts' counters.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from typing import Any, ClassVar, TypeVar

__all__ = ["Counters", "Stats", "TritonStats"]

_C = TypeVar("_C", bound="Counters")


class Counters:
    """reset() and as_dict() for a dataclass of counters guarded by its ``_lock``."""

    _lock: threading.Lock
    # Set by @dataclass on each subclass; declared here for dataclasses.fields(self).
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def reset(self) -> None:
        with self._lock:
            fresh = type(self)()
            for f in dataclasses.fields(self):
                if f.name != "_lock":
                    setattr(self, f.name, getattr(fresh, f.name))

    def snapshot(self: _C) -> _C:
        """A copy of the counters as they are now."""
        copied = type(self)()
        with self._lock:
            for f in dataclasses.fields(self):
                if f.name != "_lock":
                    setattr(copied, f.name, copy.deepcopy(getattr(self, f.name)))
        return copied

    def as_dict(self) -> dict[str, Any]:
        """A copy: the lists and dicts in it are the caller's."""
        with self._lock:
            return {
                f.name: copy.deepcopy(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if f.name != "_lock"
            }


@dataclasses.dataclass
class Stats(Counters):
    """What the hooks did in this process; read it after a compile.

    ``benchmarks`` is the number of calls of Inductor's benchmark callable that went
    through the hook (one per key or candidate subset measured here), in every mode;
    ``benchmarks_by_key`` counts them by the key they measured (a top-up of candidates
    missing from a stored entry has a key of its own, see ``extra_candidates``).
    """

    benchmarks: int = 0
    benchmarks_by_key: dict[str, int] = dataclasses.field(default_factory=dict)
    candidates_benchmarked: int = 0
    benchmark_seconds: float = 0.0
    # lookups that wanted timings (not precompile probes), by where the timings came from
    hits: int = 0  # already in the shared cache (source "hit")
    peer: int = 0  # tuned by a concurrent peer while we waited (source "peer")
    tuned: int = 0  # tuned here and published (source "tuned")
    local: int = 0  # tuned here, not published (store down, or readonly mode)
    memo: int = 0  # an entry this process had already read or written (same key again)
    fallbacks: int = 0  # tunecache failed; Inductor's own lookup answered
    # Choice lists of a stored GEMM cut to the templates that can win before generation
    # (narrow.py), the template choices that were therefore never generated, lists of
    # two or more templates generated in full (a miss, or a template not in the entry),
    # and lists generated again in full because the kept ones came out different.
    choice_lists_narrowed: int = 0
    choices_not_generated: int = 0
    choice_lists_in_full: int = 0
    narrowing_mismatches: int = 0
    # Keys tuned from their neighbours' best candidates (transfer.py), and the candidates
    # that transfer therefore never benchmarked (generated or not).
    transferred_keys: int = 0
    choice_lists_transferred: int = 0  # cut before generation by a transfer plan
    choice_lists_decided: int = 0  # cut to the one choice the neighbours decided
    transfer_skipped: int = 0
    # one dict per lookup that wanted timings: op, key hash, source, best, benchmarked
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    _lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, repr=False, compare=False
    )

    def count_benchmark(self, n_choices: int, seconds: float, key_hash: str | None) -> None:
        with self._lock:
            self.benchmarks += 1
            if key_hash is not None:
                self.benchmarks_by_key[key_hash] = self.benchmarks_by_key.get(key_hash, 0) + 1
            self.candidates_benchmarked += n_choices
            self.benchmark_seconds += seconds

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def record(self, source: str, event: dict[str, Any]) -> None:
        with self._lock:
            attr = {"hit": "hits", "fallback": "fallbacks"}.get(source, source)
            if hasattr(self, attr):
                setattr(self, attr, getattr(self, attr) + 1)
            self.events.append({"source": source, **event})

@dataclasses.dataclass
class TritonStats(Counters):
    """What the Triton autotune cache did in this process (:data:`triton_stats`).

    ``lookups`` are Inductor's reads (one per loaded kernel that autotunes and missed its
    local cache); with parallel compile they happen in the compile workers and are not
    counted here. ``puts`` are Inductor's saves, one or two per kernel tuned in this
    process (always counted here): a warm job has none.
    """

    lookups: int = 0
    hits: int = 0  # a stored, valid best config was returned: the kernel is not tuned
    misses: int = 0  # nothing stored (or a failed key): Inductor tunes the kernel
    invalid: int = 0  # stored entries refused by validation: Inductor tunes the kernel
    # stored configs that raised when compiled or launched: Inductor tuned the kernel
    stored_config_failed: int = 0
    puts: int = 0  # results Inductor saved
    published: int = 0  # results stored in the shared cache
    unpublished: int = 0  # not stored: done already, a peer publishing it, store down
    coordesc_restored: int = 0  # stored result already the launcher's (a worker hit)
    adopted: int = 0  # stored result (usually a peer's) compiled and run instead of tuning
    deferred: int = 0  # kernels launched untuned while a peer tuned them
    peer_wait_seconds: float = 0.0  # waiting for a peer's result (kernel or fusion timing)
    kept_untuned: int = 0  # deferred kernels whose later run a CUDA graph recorded
    configs_benchmark_skipped: int = 0  # autotune_to_one_config left to a peer's result
    # Coordinate descents this process ran for a key it claimed: settled by transfer
    # (the nearest neighbours' configs benchmarked against the starting config, no
    # descent), or Inductor's full descent; the configs transfer benchmarked (the
    # starting one included), and neighbours' configs that failed to compile or run.
    coordesc_transferred: int = 0
    coordesc_full: int = 0
    # Kernels that loaded the one config their neighbours all found (Settings.decisive, "triton"),
    # published here as the descent's result with nothing measured.
    coordesc_decided: int = 0
    transfer_benchmarks: int = 0
    transfer_failed: int = 0
    transfer_seconds: float = 0.0  # in transfer (outside Inductor's timed descent)
    # Configs of descents and transfers compiled in threads ahead of their benchmark
    # (Settings.compile_ahead), and those of them the benchmark took: the rest were
    # compiled for a best config the descent left before it got to them.
    compiled_ahead: int = 0
    served_ahead: int = 0
    fusion_hits: int = 0  # fusion benchmarks answered from the store (not run)
    fusion_measured: int = 0  # fusion benchmarks run here
    # fusion candidates compile_kernel sent to Triton's compile (no stored timing), and
    # those not compiled because their timing was stored (triton/candidates.py)
    fusion_candidates_compiled: int = 0
    fusion_compiles_skipped: int = 0
    # Epilogue-fusion decisions (triton/decision_replay.py): replayed without benchmarks (stored,
    # or decided by neighbours: also counted in _decided), and Inductor's own decisions
    # replaced by the one a peer published first.
    fusion_decisions_replayed: int = 0
    fusion_decisions_decided: int = 0
    fusion_decisions_adopted: int = 0
    fusion_left_to_peer: int = 0  # split-size candidates a peer was measuring: skipped
    split_values_ahead: int = 0  # split sizes measured while a peer measured the one before
    split_values_stopped: int = 0  # of those, stopped once the search no longer wanted them
    fusion_seconds: float = 0.0  # in fusion benchmarks: measuring, reading, waiting
    # Names of the kernels whose saves were the puts (the first 100): what a warm job
    # still tuned, for bench_gpu.py's report.
    saved_kernels: list[str] = dataclasses.field(default_factory=list)
    errors: int = 0  # tunecache failed inside get/put; Inductor went on without it
    wait_seconds: float = 0.0  # spent in lookups
    _lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, repr=False, compare=False
    )

    def add(self, **counts: float) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def saved(self, name: str) -> None:
        with self._lock:
            if len(self.saved_kernels) < 100:
                self.saved_kernels.append(name)
