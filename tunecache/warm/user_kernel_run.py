"""Running ``tunecache warm --user-kernels``: call each recorded user-kernel key's kernel
here with users' autotuner sharing on (and nothing else of tunecache), rank by rank, and
report what happened to each key (tunecache.user_kernels.warm chooses and calls them)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..settings import Settings
from .run import _my_order, _rank

__all__ = ["UserKernelWarmReport", "warm_user_kernels"]


@dataclasses.dataclass(frozen=True)
class UserKernelWarmReport:
    """What ``warm --user-kernels`` did on this rank: the outcome counts, one record per
    key (a mapping, as its --json prints it) and the recorded keys left out (set by the
    caller that chose the keys)."""

    database: str
    rank: int
    world_size: int
    user_kernels: int
    tuned: int
    hit: int
    peer: int
    error: int
    seconds: float
    tasks: tuple[Mapping[str, Any], ...]
    skipped: tuple[Mapping[str, Any], ...] = ()


def warm_user_kernels(settings: Settings, database: str, tasks: Sequence[Any],
                      packages: Sequence[str],
                      progress: Callable[[int, str], None] = lambda n, what: None,
                      ) -> UserKernelWarmReport:
    """Call every task's kernel (tunecache.user_kernels.warm.UserKernelTask) through its
    autotuner, with users' kernels shared under ``settings`` (transfer off: a key the
    operator tunes for the cluster is tuned in full) and whatever tunecache had on before
    put back as it was afterwards (off)."""
    from .. import counters, switch
    from ..core.cache import TuneCache
    from ..user_kernels import warm as uk_warm

    start = time.monotonic()
    done: list[dict[str, Any]] = []
    rank, world, local_rank = _rank()
    cache = TuneCache(uk_warm.settings_for_warm(settings))
    try:
        if not switch.enable(cache, only={"user_kernels"}):
            raise RuntimeError("users' kernels' sharing did not come on (see the warning "
                               "above)")
        device = uk_warm.device_for_rank(local_rank)

        def user_kernel_counts() -> dict[str, int]:
            return counters.stats().user_kernels.as_dict()

        # Under torchrun each rank starts at its share of the list: the ranks claim
        # disjoint keys first.
        for task in _my_order(tasks, rank, world):
            try:
                outcome = uk_warm.warm_user_kernel(task, packages, user_kernel_counts,
                                                   device)
                done.append({**task.as_dict(), "outcome": outcome})
            except Exception as e:  # noqa: BLE001 - one kernel's failure is reported
                done.append({**task.as_dict(), "outcome": "error",
                             "error": f"{type(e).__name__}: {e}"[:500]})
            progress(1, task.kernel)
    finally:
        switch.disable()
        cache.close()
    return UserKernelWarmReport(
        database=database, rank=rank, world_size=world, user_kernels=len(tasks),
        tuned=sum(t["outcome"] == "tuned" for t in done),
        hit=sum(t["outcome"] == "hits" for t in done),
        peer=sum(t["outcome"] == "peer" for t in done),
        error=sum(t["outcome"] == "error" for t in done),
        seconds=round(time.monotonic() - start, 3), tasks=tuple(done))
