"""The answer for one key: its timings, the winner, and where they came from."""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["Result", "Source"]

Source = Literal["hit", "tuned", "peer", "local", "failed"]


@dataclasses.dataclass(frozen=True)
class Result:
    """Timings of one key. ``best`` is the least time, ties broken by candidate name.

    ``source``: ``hit`` (already in the cache), ``tuned`` (this process tuned and published
    it), ``peer`` (another process tuned it while this one waited), ``local`` (tuned here
    without the cache: store unavailable, readonly miss, invalid entry, or wait timeout),
    ``failed`` (the key failed its tuner too often; ``error`` says why).
    """

    key_hash: str
    timings: dict[str, float]
    best: str | None
    source: Source
    tune_seconds: float | None = None
    error: str | None = None
