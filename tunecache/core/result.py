"""The answer for one key: its timings, the winner, and where they came from."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["Result", "Source", "Tuned", "Neighbour"]

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
    # The entry's meta object (keys.validate_meta): provenance, the untuned choice's time.
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Tuned(dict[str, float]):
    """What a tuner may return instead of a plain mapping: the timings, and ``meta``, a
    JSON object stored beside them (how they were found, the untuned choice's time)."""

    def __init__(self, timings: Mapping[str, float], meta: Mapping[str, Any] | None = None):
        super().__init__(timings)
        self.meta: dict[str, Any] = dict(meta or {})


@dataclasses.dataclass(frozen=True)
class Neighbour:
    """A done entry of the same family as a key being asked for (TuneCache.neighbours):
    its key mapping, timings and meta, all validated."""

    key_hash: str
    key: Mapping[str, Any]
    timings: dict[str, float]
    meta: Mapping[str, Any]
