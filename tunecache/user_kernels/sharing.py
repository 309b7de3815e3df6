"""One process's sharing of user-kernel tunings: the cache it goes through, what it
counted, and the one tuning of a key (:meth:`UserKernelSharing.settle`).

A key is settled through the tuning protocol every other kind uses
(:meth:`tunecache.TuneCache.get_or_tune`): the first process to claim it runs Triton's
own benchmark and publishes every config's time; the others wait for that entry (up to
``TUNECACHE_WAIT_TIMEOUT``) and launch its winner. They wait rather than launch an untuned
config meanwhile: every rank then runs the same config from its first call, so ranks
never compute with different kernels, and waiting costs no more than the benchmark a
peer is running. Whatever goes wrong with the store (unavailable, locked, read-only
miss) ends in Triton's own tuning; once the store is found unusable, the process's
kernels tune as they would without tunecache, Triton's own file cache included.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.cache import TuneCache
from ..errors import KeyFailedError
from ..keys import Key
from ..settings import Settings
from .keys import config_id, kernel_name

__all__ = ["UserKernelStats", "UserKernelSharing", "Settled"]

log = logging.getLogger("tunecache")


@dataclasses.dataclass
class UserKernelStats:
    """What this process's user kernels did: keys found stored (``hits``), tuned here and
    published (``tuned``), waited for while a peer tuned them (``peer``), tuned here
    without the store (``local``), stored entries refused (``refused``: a config not the
    kernel's own, or no usable time) and stored configs that failed to compile or launch
    (``fallbacks``); both then tune as Triton does."""

    hits: int = 0
    tuned: int = 0
    peer: int = 0
    local: int = 0
    refused: int = 0
    fallbacks: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Settled:
    """A key's winner from the store: the config to launch and every config's time."""

    config: Any
    timings: dict[Any, float]


def _median_ms(timing: Any) -> float:
    """A config's time as Triton's benchmark gives it: the median of (median, p20, p80),
    or a single number from a ``do_bench`` of the kernel's own."""
    if isinstance(timing, (list, tuple)):
        timing = timing[0] if timing else math.inf
    ms = float(timing)
    return ms if ms >= 0 else math.inf


class UserKernelSharing:
    """The sharing of one process: opened from settings once; the cache is created on
    the first key, so a process that never tunes a user kernel never connects."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stats = UserKernelStats()
        self._lock = threading.Lock()
        self._cache: TuneCache | None = None
        self._warned: set[str] = set()

    def cache(self) -> TuneCache:
        with self._lock:
            if self._cache is None:
                self._cache = TuneCache(self.settings)
            return self._cache

    def close(self) -> None:
        with self._lock:
            cache, self._cache = self._cache, None
        if cache is not None:
            cache.close()

    def store_usable(self) -> bool:
        """Whether the database can be used now; once it failed, this process's kernels
        tune as Triton does without tunecache (its own file cache included, where the
        kernel asked for it)."""
        return self.cache().database() is not None

    def count(self, what: str) -> None:
        with self._lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)

    def warn_once(self, topic: str, message: str, *args: Any) -> None:
        """One warning per topic (a kernel's name and what went wrong with it)."""
        with self._lock:
            first = topic not in self._warned
            self._warned.add(topic)
        log.log(logging.WARNING if first else logging.DEBUG, message, *args)

    def settle(self, autotuner: Any, key: Key, configs: Sequence[Any],
               benchmark: Callable[[], None]) -> Settled | None:
        """The key's winner from the store, or None where ``benchmark`` (Triton's own)
        ran here instead and left its winner on the autotuner: this process claimed the
        key, the store was of no use, or its entry was refused."""
        ran = False

        def tune() -> Mapping[str, float]:
            nonlocal ran
            benchmark()
            ran = True
            return {config_id(c): _median_ms(t) for c, t in autotuner.configs_timings.items()}

        try:
            result = self.cache().get_or_tune(key, tune)
        except KeyFailedError as e:
            # Its tuning failed in every process that tried: Triton's error, if any,
            # comes from Triton's own benchmark here.
            self.warn_once(f"{key.hash}:failed", "tunecache: user kernel %s: %s; Triton "
                           "tunes it itself", kernel_name(autotuner), e)
            if not ran:
                benchmark()
            return None
        if ran:
            self.count("local" if result.source == "local" else "tuned")
            return None
        settled = self._validated(autotuner, result.timings, configs)
        if settled is None:
            self.count("refused")
            benchmark()
            return None
        self.count("peer" if result.source == "peer" else "hits")
        return settled

    def _validated(self, autotuner: Any, timings: Mapping[str, float],
                   configs: Sequence[Any]) -> Settled | None:
        """The stored timings as the kernel's own configs, or None (with one warning) if
        any is not one of them or none has a usable time."""
        own = {config_id(c): c for c in configs}
        strangers = [name for name in timings if name not in own]
        finite = {name: ms for name, ms in timings.items() if math.isfinite(ms)}
        if strangers or not finite:
            reason = (f"{len(strangers)} stored config(s) are not among the kernel's own"
                      if strangers else "no stored config has a time")
            self.warn_once(f"{kernel_name(autotuner)}:refused", "tunecache: user kernel %s: "
                           "stored tuning refused (%s); Triton tunes it itself",
                           kernel_name(autotuner), reason)
            return None
        winner = min(sorted(finite), key=finite.__getitem__)
        return Settled(own[winner], {own[name]: ms for name, ms in timings.items()})
