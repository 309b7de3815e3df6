"""What this process knows of the GEMM entries its hooks read, write or are tuning.

One :class:`GemmEntries` per :class:`~.gemm.GemmHooks`, shared by the selector's lookup
(gemm.py), the pre-fusion pass (deferred.py) and narrowing (narrow.py), behind its own
lock: Inductor may benchmark in a thread pool. It holds, by key hash,

- the timings of every entry read or written (entries are immutable, so they never go
  stale), which of them were transferred (meta ``"transfer"``), and which of those were
  decided by their neighbours with nothing benchmarked;
- the transfer plan of each key found without an entry, asked of the database once
  (transfer.py);
- how many templates narrowing did not generate for a key by its plan;
- the top-ups of transferred entries already looked for;
- the keys the pre-fusion pass is tuning right now, each with the slot the lookup fills.

Every method takes the key's :class:`~tunecache.keys.Key`, built once by whoever asked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import measured
from ..keys import Key, best_candidate, top_up_key
from .transfer import Plan, plan_transfer
from .upgrade import Upgrades

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..core.cache import TuneCache
    from ..core.result import Result

__all__ = ["GemmEntries", "TuningSlot"]

log = logging.getLogger("tunecache")


@dataclasses.dataclass
class TuningSlot:
    """What the lookups of a key measured while the pre-fusion pass tunes it: the
    timings, and the meta of what they measured (transfer provenance, baseline)."""

    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


class GemmEntries:
    """The GEMM entries of one set of hooks (this module's docstring); ``cache()``
    returns the shared cache they are read from and written to."""

    def __init__(self, cache: Callable[[], TuneCache]) -> None:
        self._cache = cache
        self._lock = threading.RLock()
        # key hash -> timings of entries read or written by this process (immutable)
        self._memo: dict[str, dict[str, float]] = {}
        # key hashes whose entry was transferred (meta "transfer"): its timings cover only
        # the transferred candidates, which is the whole answer while transfer is on
        self._transferred: set[str] = set()
        # key hashes of transferred entries decided without a benchmark: their one timing
        # is a neighbour's, taken at another size, never a measurement of the key
        self._decided: set[str] = set()
        # key hash -> the transfer plan for a key this process found no entry for
        self._plans: dict[str, Plan | None] = {}
        # the library versions of older entries this database holds (upgrade.py)
        self._upgrades = Upgrades()
        self._plan_warned = False
        self._replace_warned = False
        # key hash -> templates narrowing did not generate for it (transfer.py)
        self._not_generated: dict[str, int] = {}
        # (key hash, candidate ids) of transferred entries whose top-up was looked for
        self._top_ups_read: set[tuple[str, tuple[str, ...]]] = set()
        # Keys this process is tuning inside get_or_tune_many right now; shared by all
        # threads.
        self._tuning: dict[str, TuningSlot] = {}

    def transfer_on(self) -> bool:
        return self._cache().settings.shares("transfer")

    # -- stored entries

    def known(self, key: Key) -> bool:
        """Whether this process has read or written the key's entry."""
        with self._lock:
            return key.hash in self._memo

    def note(self, key: Key, timings: Mapping[str, float],
             meta: Mapping[str, Any] | None = None) -> None:
        """Remember the timings of the key's entry (and whether it was transferred or
        decided)."""
        moved = (meta or {}).get("transfer")
        with self._lock:
            self._memo[key.hash] = dict(timings)
            if moved is not None:
                self._transferred.add(key.hash)
            if isinstance(moved, Mapping) and moved.get("benchmarked") == 0:
                self._decided.add(key.hash)

    def stored(self, key: Key) -> dict[str, float] | None:
        """The stored timings of ``key``, remembered first, else read without a claim
        (and then remembered); None if there are none."""
        with self._lock:
            timings = self._memo.get(key.hash)
        if timings is not None:
            return timings
        result = self._read(key)
        if result is None:
            return None
        self.note(key, result.timings, result.meta)
        return dict(result.timings)

    def _read(self, key: Key) -> Result | None:
        """A plain read of the cache: no claim, no wait."""
        result = self._cache().lookup(key)
        return None if result is None or result.source == "failed" else result

    def get_or_tune(self, key: Key, tune: Callable[[], Mapping[str, float]],
                    ) -> tuple[dict[str, float], str]:
        """The key's timings and where they came from: ``memo`` where this process
        already read or wrote its entry, else the core's answer (which may be to tune)."""
        with self._lock:
            timings = self._memo.get(key.hash)
        if timings is not None:
            return timings, "memo"
        result = self._cache().get_or_tune(key, tune)
        timings = dict(result.timings)
        self.note(key, timings, result.meta)
        return timings, result.source

    def replace(self, key: Key, ids: Sequence[str],
                tune: Callable[[], Mapping[str, float]]) -> dict[str, float] | None:
        """The key's timings once its entry, of no use to a compile of candidate ``ids``
        (none of them has a finite timing there: a planted or foreign decision), is
        replaced: re-claimed, tuned by ``tune`` and published, or the entry
        a peer replaced it with; None where it cannot be replaced (the caller falls back).
        Left alone, every later job warned about it and tuned in full, for good."""
        from ..core.result import Result

        cache = self._cache()
        stored = cache.lookup(key)
        if stored is None or stored.source == "failed" or best_candidate(
                {i: stored.timings.get(i, math.inf) for i in ids}) is not None:
            return None
        claim = cache.reclaim(key, stored)
        if isinstance(claim, Result):
            result: Result | None = claim
        elif claim is None:
            return None
        else:
            with self._lock:
                first, self._replace_warned = not self._replace_warned, True
            log.log(logging.WARNING if first else logging.DEBUG,
                    "tunecache: the stored entry of GEMM key %s names none of this "
                    "compile's candidates; tuning the key again to replace it",
                    key.hash[:16])
            try:
                tuned = tune()
            except BaseException as e:
                cache.release(claim, f"{type(e).__name__}: {e}")
                raise
            result = cache.publish(claim, tuned, meta=getattr(tuned, "meta", None))
        if result is None or result.source == "failed":
            return None
        with self._lock:
            self._transferred.discard(key.hash)
            self._decided.discard(key.hash)
        self.note(key, result.timings, result.meta)
        return dict(result.timings)

    def transferred(self, key: Key) -> bool:
        """Whether the key's entry was transferred and transfer is on: its timings are
        then the whole answer, and what the transfer left out is not benchmarked."""
        with self._lock:
            transferred = key.hash in self._transferred
        return transferred and self.transfer_on()

    def untimed(self, key: Key, timings: Mapping[str, float],
                candidates: Sequence[str]) -> list[str]:
        """The ``candidates`` the key's entry has no measurement of here, sorted: those
        its timings lack, and, for a decided entry, all of them (its one timing was taken
        at a neighbour's size). They are what a top-up of the key times."""
        with self._lock:
            decided = key.hash in self._decided
        return sorted(i for i in candidates if decided or i not in timings)

    # -- transfer

    def plan(self, key: Key) -> Plan | None:
        """What transfer keeps for a key with no entry (None: tune it in full); asked of
        the database once per key and process."""
        with self._lock:
            if key.hash in self._plans:
                return self._plans[key.hash]
        plan = None
        if key.family is not None and self.transfer_on():
            # Asked inside the tuner of the key's claim, so whatever it raised counted as
            # that key's tuning failing: a neighbour row that broke the plan charged a key
            # it has no part in an attempt, and its next job marked the key failed. The
            # neighbours are other keys' rows; here they only fail the transfer.
            try:
                cache = self._cache()
                decisive = "gemm" in cache.settings.levers.decisive
                # The key's own entry under an older torch/Triton first, then neighbours.
                plan = self._upgrades.plan(cache, key, decisive) or plan_transfer(
                    key.mapping, cache.neighbours(key), decisive=decisive)
            except Exception as e:  # noqa: BLE001 - the key is tuned in full
                with self._lock:
                    first, self._plan_warned = not self._plan_warned, True
                log.log(logging.WARNING if first else logging.DEBUG,
                        "tunecache: no transfer plan for a GEMM key (%s: %s); tuning it in "
                        "full", type(e).__name__, e)
        with self._lock:
            self._plans[key.hash] = plan
        return plan

    def settle_decision(self, key: Key, plan: Plan, candidate: str) -> str:
        """Where the neighbours decided ``key`` (``plan.winner``; ``candidate``: the
        decided choice's id at this size), whether this process runs that one choice, so
        that every rank runs one and the same:

        - ``"ours"``: this process claimed the key and published the decision as its
          entry (transferred: ``{candidate: plan.winner_ms}``, nothing benchmarked);
        - ``"stored"``: the key has an entry now (a peer's decision or tuning), noted
          here: narrow by it;
        - ``"open"``: a peer holds the key's claim (the lookup waits for its entry), or
          there is no store to agree through (unavailable, readonly): follow the plan.
        """
        from ..core.result import Result

        if not measured.is_measured(plan.winner_ms):
            return "open"
        cache = self._cache()
        claim = cache.claim(key, wait=0.0)
        if isinstance(claim, Result):
            if claim.source == "failed":
                return "open"
            self.note(key, claim.timings, claim.meta)
            return "stored"
        if claim is None:
            return "open"
        meta = plan.meta(benchmarked=0, generated=1)
        try:
            published = cache.publish(claim, {candidate: plan.winner_ms}, tune_seconds=0.0,
                                      meta=meta)
        except BaseException as e:
            # Not left claimed for the lease: peers would wait it out.
            cache.release(claim, f"publishing a decision failed: {e!r}", failed=False)
            raise
        if published is None:
            # The claim was lost (a peer took the key over): its entry, if it is in.
            return "stored" if self.stored(key) is not None else "open"
        self.note(key, {candidate: plan.winner_ms}, meta)
        return "ours"

    def note_not_generated(self, key: Key, templates: int) -> None:
        """Narrowing generated ``templates`` fewer choices for the key, by its plan."""
        with self._lock:
            self._not_generated[key.hash] = templates

    def not_generated(self, key: Key) -> int:
        with self._lock:
            return self._not_generated.get(key.hash, 0)

    def with_top_up(self, key: Key, timings: dict[str, float],
                    candidates: Sequence[str]) -> dict[str, float]:
        """A transferred entry's timings, for a compile whose ``candidates`` it has no
        measurement of here (:meth:`untimed`) while transfer is on. The transfer left them
        out on purpose; they are
        merged only once an exhaustive top-up of them exists (warm --exhaustive, or a job
        with transfer not shared), never benchmarked. Read once per process: the memo
        then answers, so every later lookup of the key in this compile sees the same
        timings."""
        missing = self.untimed(key, timings, candidates)
        if not missing:
            return timings
        seen = (key.hash, tuple(missing))
        with self._lock:
            looked = seen in self._top_ups_read
            self._top_ups_read.add(seen)
        if looked:
            return timings
        topped_up = self._read(top_up_key(key, missing))
        if topped_up is None:
            return timings
        timings = {**timings, **topped_up.timings}
        with self._lock:
            self._memo[key.hash] = timings
        return timings

    # -- the pre-fusion pass's tuning

    @contextlib.contextmanager
    def tuning_slot(self, key: Key) -> Iterator[TuningSlot]:
        """While the pre-fusion pass tunes ``key``: the slot its lookups fill."""
        slot = TuningSlot()
        with self._lock:
            self._tuning[key.hash] = slot
        try:
            yield slot
        finally:
            with self._lock:
                self._tuning.pop(key.hash, None)

    def tuning(self, key: Key) -> TuningSlot | None:
        """The slot of a key the pre-fusion pass is tuning right now, or None."""
        with self._lock:
            return self._tuning.get(key.hash)

    def fill(self, slot: TuningSlot, timings: Mapping[str, float],
             meta: Mapping[str, Any]) -> None:
        with self._lock:
            slot.timings.update(timings)
            slot.meta = dict(meta)
