"""Running a warm-up: compile every chosen GEMM with tunecache enabled, rank by rank, and
classify each compile's outcome from the hooks' lookup events."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from .. import counters, switch
from .. import inductor as tc_inductor
from ..core.cache import TuneCache
from ..errors import StoreError
from ..keys import key_hash
from ..settings import Settings
from ..store import Database
from .build import build_call, device_for
from .choose import SkippedKey, WarmTask
from .inputs import check_inputs, parse_inputs

__all__ = ["WarmReport", "warm", "classify"]

log = logging.getLogger("tunecache")

T = TypeVar("T")


def _rank() -> tuple[int, int, int]:
    def env_int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return env_int("RANK", 0), max(1, env_int("WORLD_SIZE", 1)), env_int("LOCAL_RANK", 0)


def _my_order(tasks: Sequence[T], rank: int, world: int) -> list[T]:
    """Rank r starts at its share of the list (r/world of the way in): the ranks claim
    disjoint keys first and meet their peers' finished keys at the end."""
    if world <= 1 or not tasks:
        return list(tasks)
    start = (len(tasks) * rank) // world
    return list(tasks[start:]) + list(tasks[:start])


@contextlib.contextmanager
def _environ_restored(*names: str) -> Iterator[None]:
    """Puts ``names`` back as they were on leaving: the old value, or removed where the
    variable was absent."""
    old = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclasses.dataclass(frozen=True)
class WarmReport:
    """What ``warm`` did on this rank: the outcome counts, one record per task (a mapping,
    as its --json prints it) and the recorded keys left out (set by the caller that chose
    the tasks)."""

    database: str
    rank: int
    world_size: int
    keys: int
    tuned: int
    hit: int
    peer: int
    local: int
    not_autotuned: int
    error: int
    seconds: float
    tasks: tuple[Mapping[str, Any], ...]
    skipped: tuple[SkippedKey, ...] = ()


@contextlib.contextmanager
def compile_session(cache: TuneCache, prefix: str) -> Iterator[tuple[str, Any]]:
    """Compiles of the GEMMs of recorded keys with ``cache`` enabled: Inductor's local
    caches off and a scratch cache directory (an FX graph hit would skip the lookup), and
    everything put back afterwards, the environment variables included, ``cache`` closed.
    Yields (scratch directory, torch)."""
    with _environ_restored("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE",
                           "TORCHINDUCTOR_CACHE_DIR"):
        os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
        os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
        import torch
        import torch._dynamo

        if not switch.enable(cache):
            cache.close()
            raise RuntimeError("tunecache.enable() refused (see the warning above)")
        scratch = tempfile.mkdtemp(prefix=prefix)
        try:
            with tc_inductor.local_caches_off():
                yield scratch, torch
        finally:
            switch.disable()
            cache.close()
            shutil.rmtree(scratch, ignore_errors=True)


def warm(
    settings: Settings,
    db: Database,
    tasks: Sequence[WarmTask],
    *,
    progress: Callable[[int], None] | None = None,
) -> WarmReport:
    """Compile every task with tunecache enabled; returns counts and per-task outcomes."""
    progress = progress or (lambda _n: None)
    rank, world, local_rank = _rank()
    counts = {"tuned": 0, "hit": 0, "peer": 0, "local": 0, "not_autotuned": 0, "error": 0}
    outcomes: list[dict[str, Any]] = []
    started = time.perf_counter()
    # In full, never by transfer: warm is the offline job whose results transfer starts
    # from (docs/transfer.md).
    cache = TuneCache(dataclasses.replace(settings, share=settings.share - {"transfer"}))
    with compile_session(cache, "tunecache-warm-") as (scratch, torch):
        for i, task in enumerate(_my_order(tasks, rank, world)):
            outcome = _warm_one(task, i, scratch, local_rank, torch, tc_inductor, cache)
            counts[outcome["outcome"]] += 1
            outcomes.append(outcome)
            progress(1)
    return WarmReport(database=db.display_url, rank=rank, world_size=world, keys=len(tasks),
                      tuned=counts["tuned"], hit=counts["hit"], peer=counts["peer"],
                      local=counts["local"], not_autotuned=counts["not_autotuned"],
                      error=counts["error"], seconds=time.perf_counter() - started,
                      tasks=tuple(outcomes))


def _this_key_hash(task: WarmTask, device_type: str, tc_inductor: Any) -> str:
    """The hash of this machine's key for ``task``: what the compile must look up."""
    with tc_inductor.recorded_settings(task.precision, task.env):
        key = tc_inductor.make_key(task.op, task.inputs, None, device_type)
    return key_hash(key)[0]


def _is_done(h: str, cache: Any) -> bool:
    """Whether the cache already has key ``h`` done.

    Read straight from the store: a warm-up's look is not a hit a job had, so it must not
    count in the usage figures. (An entry whose candidate set differs from what this
    compile would build is topped up by the next job; warm does not chase that.) Raises
    StoreError only: Database.run makes one of every driver error, and the database, its
    driver and its directory are those the tasks were read from.
    """
    row = cache.store.read([h]).get(h)
    return row is not None and row.state == "done"


# The outcome of a compile that looked up the task's own key, by the lookup's source, in
# order of precedence (tunecache.inductor.Stats events).
_SOURCE_OUTCOME = (("tuned", "tuned"), ("peer", "peer"), ("local", "local"),
                   ("hit", "hit"), ("memo", "hit"))


def classify(events: Sequence[Mapping[str, Any]], fallbacks: int,
             expected: str) -> tuple[str, str | None]:
    """(outcome, reason) of one warm compile from the hook's lookup events.

    Only a lookup of ``expected`` (this machine's key for the recorded op and inputs)
    warms the task: a compile that autotuned other keys, or nothing, is not_autotuned,
    with the reason.
    """
    sources = {e.get("source") for e in events if e.get("key_hash") == expected}
    for source, outcome in _SOURCE_OUTCOME:
        if source in sources:
            return outcome, None
    if fallbacks:
        # tunecache failed (warned above); Inductor's own lookup answered, unshared.
        return "local", "tunecache failed during the lookup; Inductor tuned locally"
    others = sorted({f"{e.get('op')} {str(e.get('key_hash'))[:12]}" for e in events
                     if e.get("key_hash")})
    if others:
        return "not_autotuned", ("the compile autotuned other keys (" + ", ".join(others)
                                 + "), not this machine's key for the recorded op and "
                                 "inputs")
    return "not_autotuned", ("Inductor autotuned nothing: it had a single candidate for "
                             "this op here (e.g. fp32 mm, int_mm or mm_plus_mm on CPU: "
                             "ATen only), so no job benchmarks this key on this machine")


def _warm_one(task: WarmTask, i: int, scratch: str, local_rank: int, torch: Any,
              tc_inductor: Any, cache: Any) -> dict[str, Any]:
    record: dict[str, Any] = {**task.as_dict()}
    t0 = time.perf_counter()
    try:
        specs = parse_inputs(task.inputs)
        check_inputs(task.op, specs)
        device = device_for(specs[0].device_type, local_rank)
        expected = _this_key_hash(task, specs[0].device_type, tc_inductor)
        try:
            done = _is_done(expected, cache)
        except StoreError as e:  # the pre-check only saves time: compile the key anyway
            log.debug("tunecache warm: pre-check failed: %r", e)
            done = False
        if done:
            record.update(outcome="hit", benchmarks=0, key_hashes=[expected],
                          seconds=time.perf_counter() - t0)
            return record
        fn, args = build_call(task.op, specs, device)
        # A fresh Inductor cache directory per compile: nothing local may answer for us.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, str(i))
        torch._dynamo.reset()
        counters.reset_stats()
        tc_inductor.compile_and_run(fn, args, task.precision, task.env)
        s = counters.stats().gemm.as_dict()
        outcome, reason = classify(s["events"], s["fallbacks"], expected)
        record.update(outcome=outcome, benchmarks=s["benchmarks"],
                      key_hashes=sorted({e["key_hash"] for e in s["events"]
                                         if e.get("key_hash")}))
        if reason is not None:
            record["reason"] = reason
    except Exception as e:  # noqa: BLE001 - one bad key must not stop a nightly warm-up
        log.warning("tunecache warm: %s %s failed: %s: %s", task.op, task.inputs,
                       type(e).__name__, e)
        record.update(outcome="error", error=f"{type(e).__name__}: {e}")
    record["seconds"] = time.perf_counter() - t0
    return record
