"""What a decision may rest on: the one check every path that decides without measuring
shares (GEMM neighbours and old-version records, fusion sites, Triton configs decided by
neighbours, users' kernels).

Rows of the shared database are written by whoever can write it. A timing read from one
is a measurement only if it is a finite number of milliseconds in
[:data:`MIN_MS`, :data:`MAX_MS`] (``inf`` is how a failed candidate reads, and decides
nothing): 0, negative, NaN, infinite or absurd times (1e-300, 2^53) are none, and a row
holding one decides nothing, so no margin can be infinite or astronomically large. A
decision is only ever one of the asking call's own choices: :func:`one_of` for a choice
named by id, :func:`within` for a rank among the call's choices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeGuard

__all__ = ["MIN_MS", "MAX_MS", "is_measured", "all_measured", "margin", "one_of", "within"]

# Nothing measured takes less than a nanosecond (a kernel launch alone costs microseconds);
# a time below it makes any runner-up look decisive.
MIN_MS = 1e-6
# A timing above an hour is no measurement.
MAX_MS = 3.6e6


def is_measured(ms: Any) -> TypeGuard[float]:
    """Whether ``ms`` is a time a measurement could have given."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        return False
    try:
        value = float(ms)
    except OverflowError:  # an int of hundreds of digits
        return False
    return math.isfinite(value) and MIN_MS <= value <= MAX_MS


def all_measured(times: Mapping[str, Any] | Iterable[Any]) -> bool:
    """Whether a row's times can decide: at least one measured, and every other either
    measured or ``inf`` (a candidate that failed)."""
    values = list(times.values()) if isinstance(times, Mapping) else list(times)
    measured = [v for v in values if not (isinstance(v, float) and v == math.inf)]
    return bool(measured) and all(is_measured(v) for v in measured)


def margin(fastest: float, runner_up: float | None) -> float:
    """The runner-up's time over the fastest's, minus 1: ``inf`` where nothing else ran,
    0 where the fastest is no measurement (it then decides nothing)."""
    if not is_measured(fastest):
        return 0.0
    if runner_up is None or runner_up == math.inf:
        return math.inf
    if not is_measured(runner_up):
        return 0.0
    return max(0.0, runner_up / fastest - 1)


def one_of(identity: str, ids: Sequence[str],
           same: Callable[[str], str | None] | None = None) -> str | None:
    """The one of a call's candidate ``ids`` that ``identity`` names (equal to it, or
    ``same(id) == identity``), or None where it names none or more than one."""
    found = [i for i in ids if i == identity or (same is not None and same(i) == identity)]
    return found[0] if len(found) == 1 else None


def within(rank: Any, choices: int) -> bool:
    """Whether ``rank`` is an index among a call's ``choices``."""
    return type(rank) is int and 0 <= rank < choices
