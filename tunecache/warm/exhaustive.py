"""`tunecache warm --exhaustive`: re-tune transferred GEMM entries in full and record the
regret of the transfer.

A transferred entry (meta "transfer") holds timings of only the candidates its
neighbours' winners suggested. Compiling its GEMM again with transfer off makes Inductor
generate every candidate (narrowing does not restrict a transferred entry then), and the
lookup tunes the ones the entry lacks under the key's top-up key
(:func:`tunecache.keys.top_up_key`: the key plus its sorted missing candidates): the
stored timings and that top-up together are the exhaustive timings. An entry its
neighbours decided (nothing benchmarked) has its one candidate timed again too: its stored
time was taken at the neighbour's size. regret = the transferred winner's ms, as measured
here, / the fastest of them (>= 1.0); it is added to the entry's meta
with ``exhaustive_ms`` and ``exhaustive_at``. Only entries of this machine's environment
can be measured here: one whose key this machine would not compute is reported, not
compiled.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import counters, stored_json
from .. import inductor as tc_inductor
from ..core import Result, Tuner
from ..core.cache import TuneCache
from ..keys import Key, KeyLike, key_hash, top_up_base, validate_meta, validate_timings
from ..settings import Settings
from ..store import Database, columns, engine, warm_queries
from ..store.entry_filter import EntryFilter
from .build import build_call, device_for
from .choose import SkippedKey, WarmTask, task_of
from .inputs import parse_inputs
from .run import _my_order, _rank, _this_key_hash, classify, compile_session

__all__ = ["ExhaustiveTask", "ExhaustiveReport", "select_transferred", "exhaustive"]

log = logging.getLogger("tunecache")

# Rows per read: each may hold up to warm_queries.WARM_KEY_BYTES + WARM_TIMINGS_BYTES + the meta
# bound (144 KiB) of planted text, so a page costs at most ~14 MiB.
_PAGE = 100


@dataclasses.dataclass
class ExhaustiveTask:
    """A transferred entry to re-tune in full: its key, the GEMM that compiles it, the
    stored (transferred) timings and the transfer's provenance."""

    key_hash: str
    key: dict[str, Any]
    task: WarmTask
    timings: dict[str, float]
    transfer: dict[str, Any]
    regret: float | None  # measured before (listed with --again)

    @property
    def winner(self) -> str | None:
        """The stored winner's candidate id."""
        timed = {c: ms for c, ms in self.timings.items() if math.isfinite(ms) and ms > 0}
        return min(timed, key=timed.__getitem__) if timed else None

    @property
    def winner_ms(self) -> float | None:
        return _fastest(self.timings)

    def as_dict(self) -> dict[str, Any]:
        return {"key_hash": self.key_hash, **self.task.as_dict(),
                "candidates": len(self.timings), "winner_ms": self.winner_ms,
                "benchmarked": self.transfer.get("benchmarked"),
                "generated": self.transfer.get("generated"), "regret_before": self.regret}


def _fastest(timings: Mapping[str, float]) -> float | None:
    return min((ms for ms in timings.values() if math.isfinite(ms) and ms > 0), default=None)


def select_transferred(
    db: Database,
    ops: Sequence[str] | None = None,
    *,
    from_torch: Sequence[str] = (),
    from_device: Sequence[str] = (),
    again: bool = False,
    limit: int | None = None,
) -> tuple[list[ExhaustiveTask], list[SkippedKey]]:
    """Done GEMM entries whose meta says "transfer" (and, unless ``again``, no "regret"
    yet), in key hash order, and the ones skipped with the reason (a key warm cannot
    rebuild, or garbled timings). Rows with a garbled meta are not transferred ones."""
    env = EntryFilter(only={"torch": list(from_torch), "device": list(from_device)},
                      ops=list(ops or ()), kinds=["gemm"])
    tasks: list[ExhaustiveTask] = []
    skipped: list[SkippedKey] = []
    after = ""
    while limit is None or len(tasks) < limit:
        page = db.run(functools.partial(
            engine.rows, statement=warm_queries.select_transferred_page(env, after, _PAGE)))
        if not page:
            break
        after = page[-1].key_hash
        for row in page:
            meta = validate_meta(columns.text(row.meta_json))
            moved = meta.get("transfer")
            if not isinstance(moved, dict):
                continue
            regret = meta.get("regret")
            regret = columns.time(regret)
            if regret is not None and not again:
                continue
            task, skip = task_of(row.key_hash, row.key_json)
            if skip is not None:
                skipped.append(skip)
            if task is None:
                continue
            try:
                timings = validate_timings(columns.text(row.timings_json), row.key_hash)
                key = stored_json.loads(row.key_json, warm_queries.WARM_KEY_BYTES)
                if key_hash(key)[0] != row.key_hash:
                    raise ValueError("the key does not hash to its key_hash")
            except Exception as e:  # noqa: BLE001 - a garbled row costs only itself
                skipped.append({"key_hash": row.key_hash, "op": task.op,
                                "reason": f"the stored entry does not read back: {e}"})
                continue
            tasks.append(ExhaustiveTask(row.key_hash, key, task, timings, moved, regret))
            if limit is not None and len(tasks) >= limit:
                break
    return tasks, skipped


@dataclasses.dataclass(frozen=True)
class ExhaustiveReport:
    """What ``warm --exhaustive`` did on this rank: the outcome counts, the regrets
    measured, one record per task (a mapping, as its --json prints it) and the recorded
    keys left out (set by the caller that chose the tasks)."""

    database: str
    rank: int
    world_size: int
    keys: int
    measured: int
    other_environment: int
    not_autotuned: int
    error: int
    regret_mean: float | None
    regret_max: float | None
    seconds: float
    tasks: tuple[Mapping[str, Any], ...]
    skipped: tuple[SkippedKey, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "exhaustive": True}


class _TopUps(TuneCache):
    """The cache the compiles use: it records the results of top-up keys
    (:func:`tunecache.keys.top_up_key`) by the hash of their base key, so the run can
    merge them with the stored entry's timings. Only observes; every call goes to the
    cache."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.top_ups: dict[str, list[Result]] = {}

    def get_or_tune_many(self, keys: Sequence[KeyLike], tune: Tuner) -> list[Result]:
        results = super().get_or_tune_many(keys, tune)
        for k, result in zip(keys, results):
            base = top_up_base(k.mapping if isinstance(k, Key) else k)
            if base is not None:
                self.top_ups.setdefault(key_hash(base)[0], []).append(result)
        return results


def exhaustive(
    settings: Settings,
    db: Database,
    tasks: Sequence[ExhaustiveTask],
    *,
    progress: Callable[[int], None] | None = None,
) -> ExhaustiveReport:
    """Compile every task's GEMM with transfer off and record each entry's regret."""
    progress = progress or (lambda _n: None)
    rank, world, local_rank = _rank()
    counts = {"measured": 0, "other_environment": 0, "not_autotuned": 0, "error": 0}
    outcomes: list[dict[str, Any]] = []
    started = time.perf_counter()
    cache = _TopUps(dataclasses.replace(settings, share=settings.share - {"transfer"}))
    with compile_session(cache, "tunecache-exhaustive-") as (scratch, torch):
        for i, task in enumerate(_my_order(tasks, rank, world)):
            outcome = _measure_one(task, i, scratch, local_rank, torch, cache)
            counts[outcome["outcome"]] += 1
            outcomes.append(outcome)
            progress(1)
    regrets = [o["regret"] for o in outcomes if o["outcome"] == "measured"]
    return ExhaustiveReport(
        db.display_url, rank, world, len(tasks), counts["measured"],
        counts["other_environment"], counts["not_autotuned"], counts["error"],
        regret_mean=sum(regrets) / len(regrets) if regrets else None,
        regret_max=max(regrets) if regrets else None,
        seconds=time.perf_counter() - started, tasks=tuple(outcomes))


def _measure_one(task: ExhaustiveTask, i: int, scratch: str, local_rank: int, torch: Any,
                 cache: _TopUps) -> dict[str, Any]:
    record: dict[str, Any] = task.as_dict()
    t0 = time.perf_counter()
    try:
        specs = parse_inputs(task.task.inputs)
        here = _this_key_hash(task.task, specs[0].device_type, tc_inductor)
        if here != task.key_hash:
            record.update(outcome="other_environment",
                          reason="recorded in another environment (device, torch, triton "
                                 "or Inductor flags): this machine computes another key")
            return record
        device = device_for(specs[0].device_type, local_rank)
        fn, args = build_call(task.task.op, specs, device)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, str(i))
        torch._dynamo.reset()
        counters.reset_stats()
        cache.top_ups.pop(task.key_hash, None)
        tc_inductor.compile_and_run(fn, args, task.task.precision, task.task.env)
        s = counters.stats().gemm.as_dict()
        outcome, reason = classify(s["events"], s["fallbacks"], task.key_hash)
        record["benchmarks"] = s["benchmarks"]
        if outcome not in ("hit", "tuned", "peer"):
            # The compile never read the entry through the shared cache: nothing measured.
            record.update(outcome="error" if outcome == "local" else "not_autotuned",
                          reason=reason or f"the compile's lookup was {outcome}")
            if outcome == "local":
                record["error"] = record["reason"]
            return record
        merged = dict(task.timings)
        top_up_hashes = []
        for result in cache.top_ups.get(task.key_hash, []):
            top_up_hashes.append(result.key_hash)
            merged.update(result.timings)
        # The transferred winner's time as measured here: a decided entry's stored one was
        # its neighbour's, and its top-up timed the winner again.
        winner = task.winner
        winner_ms = merged.get(winner) if winner is not None else None
        best = _fastest(merged)
        if winner_ms is None or not math.isfinite(winner_ms) or best is None:
            raise ValueError("no candidate has a finite timing")
        regret = winner_ms / best
        fields = {"regret": regret, "exhaustive_ms": best, "exhaustive_at": time.time()}
        if not cache.update_meta(task.key, **fields):
            raise RuntimeError("the regret could not be recorded (the entry is gone, the "
                               "cache is read-only, or the database is unavailable)")
        record.update(outcome="measured", regret=regret, exhaustive_ms=best,
                      candidates_after=len(merged), top_up_keys=top_up_hashes)
    except Exception as e:  # noqa: BLE001 - one bad key must not stop a nightly run
        log.warning("tunecache warm --exhaustive: %s %s failed: %s: %s", task.task.op,
                    task.task.inputs, type(e).__name__, e)
        record.update(outcome="error", error=f"{type(e).__name__}: {e}")
    finally:
        record["seconds"] = time.perf_counter() - t0
    return record
