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

With ``TUNECACHE_USER_KERNEL_TRANSFER=1`` (off until measured on GPUs), a key value never
tuned (a new sequence length) that has two recorded values of the same kernel within
three octaves benchmarks only their winners, and its entry says so (meta ``transfer``,
as a transferred GEMM's). With ``TUNECACHE_USER_KERNEL_REGRET=1``, a job that reads a
transferred entry benchmarks every config of it once and records the regret (the stored
winner's time over the fastest's) in its meta, for ``tunecache stats``; it still launches
the stored winner.

After an upgrade of torch or Triton, a key with no entry whose same key (every field but
the versions, :data:`.tuning_keys.VERSION_FIELDS`) was recorded under an older version
on the same device benchmarks only that record's winner and the configs within
:data:`UPGRADE_MARGIN` of it (on with transfer, ``TUNECACHE_SHARE``'s default): the
configs are the kernel's own list, unchanged, so the old winner almost always still
wins. Its entry is one of the new version, with ``meta["transfer"]["from_version"]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .. import measured
from ..core.cache import TuneCache
from ..core.earlier_versions import EarlierVersions
from ..core.result import Neighbour, Result, Tuned
from ..errors import KeyFailedError
from ..keys import Key, meta_to_json, octaves_apart
from ..settings import Settings
from .calls import REPLAY
from .tuning_keys import VERSION_FIELDS, config_id, kernel_name

__all__ = ["UserKernelStats", "UserKernelSharing", "Settled", "TransferPlan",
           "TRANSFER_NEIGHBOURS", "TRANSFER_MAX_OCTAVES"]

log = logging.getLogger("tunecache")


@dataclasses.dataclass
class UserKernelStats:
    """What this process's user kernels did: keys found stored (``hits``), tuned here and
    published (``tuned``), waited for while a peer tuned them (``peer``), tuned here
    without the store (``local``), stored entries refused (``refused``: a config not the
    kernel's own, or no usable time) and stored configs that failed to compile or launch
    (``fallbacks``); both then tune as Triton does. ``transferred``: keys tuned here on
    only their neighbours' winners, or after an upgrade their old record's;
    ``regret_measured``: transferred keys whose every config was benchmarked to measure
    the transfer's regret."""

    hits: int = 0
    tuned: int = 0
    peer: int = 0
    local: int = 0
    refused: int = 0
    fallbacks: int = 0
    transferred: int = 0
    regret_measured: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, 0)


# A key value never tuned, with transfer on, benchmarks the winners of this many nearest
# recorded values of the same kernel, each at most this many octaves away (summed over
# the tuning values that differ), or is tuned in full. Two, so that no single row decides
# alone what is benchmarked: one planted neighbour adds at most one candidate, and the
# other neighbour's winner is measured beside it.
TRANSFER_NEIGHBOURS = 2
TRANSFER_MAX_OCTAVES = 3.0
# After an upgrade, the old record's configs this close to its winner's time (their time
# over the winner's, minus 1) are benchmarked with it: GEMM's decisive margin
# (inductor/transfer.py), below which a winner is not taken as settled.
UPGRADE_MARGIN = 0.25


@dataclasses.dataclass(frozen=True)
class TransferPlan:
    """The configs a transferred key benchmarks, and the entry's provenance."""

    configs: list[Any]
    meta: dict[str, Any]


@contextlib.contextmanager
def _benchmarking_only(configs: list[Any], subset: list[Any]) -> Iterator[None]:
    """Triton's ``benchmark`` closure runs every config of the very list its ``run``
    passed to ``check_disk_cache`` (``pruned_configs``, which is the autotuner's own
    ``configs`` where nothing is pruned): narrowed in place for that call, then put back."""
    kept = list(configs)
    configs[:] = subset
    try:
        yield
    finally:
        configs[:] = kept


@dataclasses.dataclass(frozen=True)
class Settled:
    """A key's winner from the store: the config to launch and every config's time."""

    config: Any
    timings: dict[Any, float]


def _median_ms(timing: Any) -> float:
    """A config's time as Triton's benchmark gives it: the first of (median, p20, p80),
    or a single number from a ``do_bench`` of the kernel's own; ``inf`` (failed) for
    anything else."""
    if isinstance(timing, (list, tuple)):
        timing = timing[0] if timing else math.inf
    try:
        ms = float(timing)
    except (TypeError, ValueError):
        return math.inf
    return ms if ms >= 0 else math.inf


def _with_call(meta: dict[str, Any], call: dict[str, Any] | None) -> dict[str, Any]:
    """``meta`` with the recorded call, unless there is none or it would not fit the
    entry's meta (then the key is only not re-tunable by warm)."""
    if call is None:
        return meta
    with_call = {**meta, REPLAY: call}
    try:
        meta_to_json(with_call)
    except ValueError:
        return meta
    return with_call


class UserKernelSharing:
    """The sharing of one process, over the process's one cache (``cache`` opens it at
    the first key, so a process that never tunes a user kernel never connects), counting
    into ``stats``."""

    def __init__(self, settings: Settings, cache: Callable[[], TuneCache],
                 stats: UserKernelStats | None = None) -> None:
        self.settings = settings
        self.cache = cache
        self.stats = stats if stats is not None else UserKernelStats()
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._earlier = EarlierVersions()

    def store_usable(self) -> bool:
        """Whether the database can be used now; once it failed, this process's kernels
        tune as Triton does without tunecache (its own file cache included, where the
        kernel asked for it)."""
        try:
            return self.cache().database() is not None
        except Exception:  # noqa: BLE001 - a cache that cannot open: Triton tunes
            return False

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
               benchmark: Callable[[], None],
               describe_call: Callable[[], dict[str, Any] | None] = lambda: None,
               ) -> Settled | None:
        """The key's winner from the store, or None where ``benchmark`` (Triton's own)
        ran here instead and left its winner on the autotuner: this process claimed the
        key, the store was of no use, or its entry was refused. A key tuned here stores
        ``describe_call()`` beside its timings (:mod:`.replay`), where it fits."""
        ran = False
        transferred = False

        def tune() -> Tuned:
            nonlocal ran, transferred
            plan = self._upgrade(key, configs)
            if plan is None and self.settings.levers.user_kernel_transfer:
                plan = self._transfer(key, configs)
            if plan is not None and isinstance(configs, list):
                with _benchmarking_only(configs, plan.configs):
                    benchmark()
                transferred = True
            else:
                plan = None
                benchmark()
            ran = True
            timings = {config_id(c): _median_ms(t) for c, t in autotuner.configs_timings.items()}
            return Tuned(timings, _with_call(plan.meta if plan is not None else {},
                                             describe_call()))

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
            if transferred:
                self.count("transferred")
            return None
        settled = self._validated(autotuner, result.timings, configs)
        if settled is None:
            self.count("refused")
            self._replace(autotuner, key, result, benchmark, describe_call)
            return None
        self.count("peer" if result.source == "peer" else "hits")
        if (self.settings.levers.user_kernel_regret and "transfer" in result.meta
                and "regret" not in result.meta):
            self._measure_regret(autotuner, key, settled, benchmark)
        return settled

    def _replace(self, autotuner: Any, key: Key, refused: Result,
                 benchmark: Callable[[], None],
                 describe_call: Callable[[], dict[str, Any] | None]) -> None:
        """Triton's own benchmark for a key whose entry was refused, published in its
        place where this process re-claims it: left there, it was refused (and warned
        about) by every job, for good."""
        cache = self.cache()
        try:
            claim = cache.reclaim(key, refused)
        except Exception as e:  # noqa: BLE001 - the entry stays; Triton tunes it here
            log.debug("tunecache: a refused user kernel entry not re-claimed: %r", e)
            claim = None
        if claim is None or isinstance(claim, Result):
            benchmark()
            return
        try:
            benchmark()
        except BaseException as e:
            cache.release(claim, f"{type(e).__name__}: {e}")
            raise
        timings = {config_id(c): _median_ms(t) for c, t in autotuner.configs_timings.items()}
        try:
            cache.publish(claim, timings, meta=_with_call({}, describe_call()))
        except Exception as e:  # noqa: BLE001 - not shared: the next job measures it
            cache.release(claim, f"publishing failed: {e!r}", failed=False)

    def _transfer(self, key: Key, configs: Sequence[Any]) -> TransferPlan | None:
        """The winners of the key's nearest recorded values (:data:`TRANSFER_NEIGHBOURS`
        within :data:`TRANSFER_MAX_OCTAVES`), or None: tune in full. A neighbour that
        names a config not among ours (planted) is not one."""
        if not isinstance(configs, list):
            return None
        own = {config_id(c): c for c in configs}
        try:
            found = self.cache().neighbours(key)
        except Exception as e:  # noqa: BLE001 - the key is tuned in full
            self.warn_once("transfer", "tunecache: no transfer for a user kernel key (%s: %s); "
                           "tuning it in full", type(e).__name__, e)
            return None
        near = []
        for neighbour in found:
            apart = octaves_apart(key["tuning_key"], neighbour.key.get("tuning_key"),
                                  most_total=TRANSFER_MAX_OCTAVES)
            if apart is None:
                continue
            if any(name not in own for name in neighbour.timings) \
                    or not measured.all_measured(neighbour.timings):
                continue
            finite = {n: ms for n, ms in neighbour.timings.items() if math.isfinite(ms)}
            if finite:
                winner = min(sorted(finite), key=finite.__getitem__)
                near.append((apart, neighbour.key_hash, winner))
        chosen = sorted(near)[:TRANSFER_NEIGHBOURS]
        subset = [own[name] for name in dict.fromkeys(w for _, _, w in chosen)]
        if len(chosen) < TRANSFER_NEIGHBOURS or len(subset) >= len(configs):
            return None
        return TransferPlan(subset, {"transfer": {
            "from": [h for _, h, _ in chosen], "benchmarked": len(subset),
            "generated": len(configs)}})

    def _upgrade(self, key: Key, configs: Sequence[Any]) -> TransferPlan | None:
        """After an upgrade: the key's own record under the newest older version that has
        one (this module's docstring), or None: no such record, or none usable."""
        if not (self.settings.shares("transfer") and isinstance(configs, list)):
            return None
        own = {config_id(c): c for c in configs}
        try:
            cache = self.cache()
            twins = [(Key.of({**key.mapping, "env": env}), fields)
                     for env, fields in self._earlier.older_envs(cache, key, VERSION_FIELDS)]
            found = {n.key_hash: n for n in cache.recorded([k for k, _ in twins])} \
                if twins else {}
        except Exception as e:  # noqa: BLE001 - the key is tuned in full
            self.warn_once("upgrade", "tunecache: no upgrade path for a user kernel key "
                           "(%s: %s); tuning it in full", type(e).__name__, e)
            return None
        for twin, fields in twins:
            record = found.get(twin.hash)
            if record is None:
                continue
            subset = _old_winners(record, own)
            if subset is not None and len(subset) < len(configs):
                return TransferPlan([own[name] for name in subset], {"transfer": {
                    "from": [record.key_hash], "from_version": dict(fields),
                    "benchmarked": len(subset), "generated": len(configs)}})
        return None

    def _measure_regret(self, autotuner: Any, key: Key, settled: Settled,
                        benchmark: Callable[[], None]) -> None:
        """Benchmark every config of a transferred key (Triton's own benchmark) and
        record the regret: the stored winner's time here over the fastest's. The stored
        winner is still the one launched, as on every other rank."""
        benchmark()
        timings = {c: _median_ms(t) for c, t in autotuner.configs_timings.items()}
        finite = [ms for ms in timings.values() if math.isfinite(ms) and ms > 0]
        ours = timings.get(settled.config, math.inf)
        if not finite or not math.isfinite(ours):
            return
        best = min(finite)
        if self.cache().update_meta(key, regret=ours / best, exhaustive_ms=best,
                                    exhaustive_at=time.time()):
            self.count("regret_measured")

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


def _old_winners(record: Neighbour, own: Mapping[str, Any]) -> list[str] | None:
    """The ids of an old record's winner and of its configs within
    :data:`UPGRADE_MARGIN` of it, fastest first; None where the record names a config
    not among ``own`` or holds a time that is no measurement (planted or torn: no
    source)."""
    if any(name not in own for name in record.timings) \
            or not measured.all_measured(record.timings):
        return None
    finite = sorted((ms, name) for name, ms in record.timings.items() if math.isfinite(ms))
    if not finite:
        return None
    best = finite[0][0]
    return [name for ms, name in finite if ms <= best * (1 + UPGRADE_MARGIN)]
