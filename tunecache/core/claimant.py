"""One process's side of the claim protocol: claim -> tune -> publish, wait for peers, take over.

A :class:`Claimant` is the owner its claims name (host, pid and a random tag, anew in a
forked child), the heartbeat that renews them, and the loop behind
:meth:`TuneCache.get_or_tune_many <tunecache.core.cache.TuneCache.get_or_tune_many>`:
claim the first free keys in the caller's order (a batch while tuning is nearly free),
tune them with no transaction open, publish each result in the transaction that claims
the next keys, then wait for the keys peers hold, taking over any whose lease passes. It
also turns a settled row into the :class:`Result` every process returns, warning once
per key about a row it cannot use.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from ..errors import InvalidEntryError, StoreError
from ..keys import (
    Key,
    best_candidate,
    meta_to_json,
    timings_to_json,
    validate_meta,
    validate_timings,
)
from ..settings import Settings
from ..store import Claim, ClaimStore, Entry, Publication
from .availability import Availability
from .heartbeat import Heartbeat
from .result import Result, Source

__all__ = ["Claimant", "Tuner"]

logger = logging.getLogger("tunecache")

# A tuner gets the Key it was asked for (the caller's mapping is its ``mapping``).
Tuner = Callable[[Key], Mapping[str, float]]

# How many keys one claim step looks at. Processes walk the key list in the same order, so
# the first free key is almost always within the first few; the window only bounds a read.
_CLAIM_WINDOW = 16
_CHEAP_TUNE_SECONDS = 0.005


class Claimant:
    """The claims of one :class:`~tunecache.core.cache.TuneCache`, in one process at a
    time (a forked child gets a new owner and heartbeat)."""

    def __init__(self, store: ClaimStore, settings: Settings, available: Availability) -> None:
        self._store = store
        self.settings = settings
        self._available = available
        # The failure policy: a store error met here sends the whole cache to tuning locally.
        self._disable = available.disable
        self._warned_keys: set[str] = set()
        self._owner_pid = -1
        self._owner = ""
        self._heartbeat: Heartbeat | None = None

    def owner_id(self) -> str:
        """The owner this process's claims name."""
        pid = os.getpid()
        if self._owner_pid != pid:
            self._owner = f"{socket.gethostname()[:200]}:{pid}:{uuid.uuid4().hex[:8]}"
            self._owner_pid = pid
        return self._owner

    def _heartbeat_thread(self) -> Heartbeat:
        if self._heartbeat is None or self._heartbeat.pid != os.getpid():
            self._heartbeat = Heartbeat(self._store, self.settings.lease_seconds)
        return self._heartbeat

    def stop(self) -> None:
        """Stop this process's heartbeat (a later claim starts a new one)."""
        if self._heartbeat is not None and self._heartbeat.pid == os.getpid():
            self._heartbeat.stop()
        self._heartbeat = None

    def claim_tune_wait(
        self, keys: Mapping[str, Key], tune: Tuner, results: dict[str, Result]
    ) -> None:
        """Put the result of each of ``keys`` (by hash) that the protocol settles into
        ``results``: tuned here, published by a peer, or failed. The rest are the caller's
        to tune locally: rows no process will finish, and keys whose peers made no
        progress for ``settings.wait_timeout``. Raises StoreError, keeping what was tuned
        here (as ``local``) in ``results``."""
        owner = self.owner_id()
        heartbeat = self._heartbeat_thread()
        todo = list(keys)  # free as far as we know, in the caller's order
        waiting: list[str] = []  # claimed by peers
        # Every claim held is in one of these two lists between steps, and the heartbeat
        # renews it until the step that publishes or gives it back (else a batch's later
        # keys outlast the lease and a peer takes over a live owner's key).
        publications: list[Publication] = []  # tuned, to publish
        returned: list[Claim] = []  # claimed but not tuned, to give back
        batch = 1
        idle_since = time.monotonic()
        poll = 0.01
        while todo or waiting or publications or returned:
            if todo or publications or returned:
                window = todo[: _CLAIM_WINDOW + batch]
                if batch > 1:
                    # Cheap keys: start at a random place, so that processes claiming
                    # batches do not queue behind each other's uncommitted inserts.
                    # (Fairness is moot when tuning costs nothing.) Claimed in the list's
                    # order all the same: two PostgreSQL transactions that insert the same
                    # keys in different orders deadlock, and each deadlock costs its
                    # detection (deadlock_timeout, 1 s) against the lock timeout.
                    at = random.randrange(len(todo)) if todo else 0
                    chosen = set((todo[at:] + todo[:at])[: _CLAIM_WINDOW + batch])
                    window = [h for h in todo if h in chosen]
                # Keys given back in this step are claimable from the next one on (the
                # step claims before it gives back: ClaimStore.step says why).
                given_back = {c.key_hash for c in returned}
                window = [h for h in window if h not in given_back]
                heartbeat.release(returned, wait=True)
                started = time.perf_counter()
                try:
                    outcome = self._store.step(
                        publish=publications,
                        give_back=returned,
                        candidates=[keys[h] for h in window],
                        limit=batch,
                        owner=owner,
                        lease_seconds=self.settings.lease_seconds,
                        max_attempts=self.settings.max_attempts,
                    )
                except StoreError:
                    # What was tuned here is a result all the same: keep it (as local,
                    # the store having failed) rather than tune it again.
                    for pub in publications:
                        h = pub.claim.key_hash
                        results[h] = Result(h, validate_timings(pub.timings_json, h), pub.best,
                                            "local", pub.tune_seconds,
                                            meta=validate_meta(pub.meta_json))
                    heartbeat.release(pub.claim for pub in publications)
                    raise
                heartbeat.hold(outcome.claimed)
                heartbeat.release(pub.claim for pub in publications)
                step_seconds = time.perf_counter() - started
                for pub, accepted in zip(publications, outcome.published):
                    h = pub.claim.key_hash
                    if accepted:
                        results[h] = Result(h, validate_timings(pub.timings_json, h), pub.best,
                                            "tuned", pub.tune_seconds,
                                            meta=validate_meta(pub.meta_json))
                    else:
                        # Our claim was taken over while we were frozen or slow: the new
                        # owner's result is the one everybody uses, so wait for it.
                        logger.warning(
                            "tunecache: lost the claim on %s before publishing; "
                            "using the result of the process that took it over", h[:16]
                        )
                        waiting.append(h)
                claimed = {c.key_hash for c in outcome.claimed}
                for h in window:
                    row = outcome.seen.get(h)
                    if h in claimed or row is None or row.lease_expired:
                        continue  # ours now, or still free: a later step claims it
                    todo.remove(h)
                    if row.stranded:
                        self.warn_stranded(row)  # left to the local fallback
                    elif not self.settle(row, "hit", results):
                        waiting.append(h)
                for h in claimed:
                    todo.remove(h)
                publications, returned = self._tune_batch(outcome.claimed, keys, tune)
                if returned:
                    back = {c.key_hash for c in returned} | set(todo)
                    todo = [h for h in keys if h in back]
                batch = _next_batch(step_seconds, publications)
                # The wait timeout counts time spent waiting on peers, not our own
                # tuning (a rank that tuned for long still waits for its peers).
                idle_since = time.monotonic()
                continue
            # Only peers' keys are left: watch them.
            rows = self._store.read(waiting)
            progressed = False
            for h in list(waiting):
                row = rows.get(h)
                if row is None or row.lease_expired:
                    waiting.remove(h)
                    # Owner gone (or entry pruned): try to claim it, in the list's order
                    # like every claim, or two steps can deadlock on PostgreSQL.
                    back = {*todo, h}
                    todo = [k for k in keys if k in back]
                    progressed = True
                elif row.stranded:
                    waiting.remove(h)
                    self.warn_stranded(row)  # left to the local fallback
                    progressed = True
                elif self.settle(row, "peer", results):
                    waiting.remove(h)
                    progressed = True
            if progressed:
                idle_since, poll = time.monotonic(), 0.01
                continue
            if time.monotonic() - idle_since > self.settings.wait_timeout:
                logger.warning(
                    "tunecache: peers made no progress on %d key(s) for %gs "
                    "(TUNECACHE_WAIT_TIMEOUT); tuning them locally",
                    len(waiting), self.settings.wait_timeout,
                )
                return
            self._store.wait_for_change(poll)
            poll = min(poll * 2, 0.5)

    def _tune_batch(
        self, claims: Sequence[Claim], keys: Mapping[str, Key], tune: Tuner
    ) -> tuple[list[Publication], list[Claim]]:
        """Tune claimed keys in order: (publications, claims to give back untuned).

        A batch is claimed only while tuning looks free (:func:`_next_batch`); once a key
        turns out to cost time, the rest go back, so that idle peers take them. If a
        tuner raises, what was tuned before it is published and the rest given back
        before the error propagates.
        """
        publications: list[Publication] = []
        for i, claim in enumerate(claims):
            if publications and publications[-1].tune_seconds >= _CHEAP_TUNE_SECONDS:
                return publications, list(claims[i:])
            try:
                publications.append(self._tune_claimed(claim, keys[claim.key_hash], tune))
            except BaseException:
                self._finish(publications, claims[i + 1 :])
                raise
        return publications, []

    def _finish(self, publications: Sequence[Publication], rest: Sequence[Claim]) -> None:
        """Publish and give back what a failed batch leaves, in one step."""
        heartbeat = self._heartbeat_thread()
        heartbeat.release(rest, wait=True)
        try:
            if (publications or rest) and not self._available.reason:
                self._store.step(
                    publish=publications, give_back=rest, candidates=[], limit=0,
                    owner=self.owner_id(), lease_seconds=self.settings.lease_seconds,
                    max_attempts=self.settings.max_attempts,
                )
        except StoreError as e:
            self._disable(e)
        finally:
            heartbeat.release(pub.claim for pub in publications)

    def warn_stranded(self, row: Entry) -> None:
        """Warn, once per key, that no process will finish ``row`` (it is tuned locally)."""
        if row.key_hash not in self._warned_keys:
            self._warned_keys.add(row.key_hash)
            logger.warning("tunecache: key %s is %s, so no process will finish it; "
                           "tuning it locally", row.key_hash[:16], row.stranded)

    def settle(self, row: Entry, source: Source, results: dict[str, Result]) -> bool:
        """Record a finished row's result; False while it is still being tuned."""
        if row.state == "done":
            result = self.result_from_row(row, source)
            if result is not None:
                results[row.key_hash] = result
            return True  # an invalid entry is left to the local fallback
        if row.state == "failed":
            results[row.key_hash] = Result(
                row.key_hash, {}, None, "failed", error=row.error or "failed"
            )
            return True
        return False

    def result_from_row(self, row: Entry, source: Source) -> Result | None:
        """A done row's result; None for timings that do not validate (warned once per
        key: the caller tunes it locally)."""
        try:
            timings = validate_timings(row.timings_json, row.key_hash)
        except InvalidEntryError as e:
            if row.key_hash not in self._warned_keys:
                self._warned_keys.add(row.key_hash)
                logger.warning("tunecache: %s; tuning it locally", e)
            return None
        return Result(row.key_hash, timings, best_candidate(timings), source, row.tune_seconds,
                      meta=validate_meta(row.meta_json))

    def _tune_claimed(self, claim: Claim, key: Key, tune: Tuner) -> Publication:
        """Tune a claimed key (its claim stays held until published); if the tuner
        raises, give the claim back as a failed attempt."""
        start = time.perf_counter()
        try:
            tuned = tune(key)
            timings = validate_timings(dict(tuned), key.hash)
            meta_json = meta_to_json(getattr(tuned, "meta", None))
        except BaseException as e:
            self._heartbeat_thread().release([claim], wait=True)
            try:
                state = self._store.release(
                    claim, f"{type(e).__name__}: {e}", self.settings.max_attempts
                )
                logger.warning("tunecache: tuning %s raised %s; key is now %s",
                               key.hash[:16], type(e).__name__, state or "someone else's")
            except StoreError as store_error:
                self._disable(store_error)
            raise
        return Publication(
            claim, timings_to_json(timings), best_candidate(timings),
            time.perf_counter() - start, meta_json,
        )


def _next_batch(step_seconds: float, tuned: Sequence[Publication]) -> int:
    """How many keys to claim in the next step.

    One, so that equal work splits evenly between processes, unless tuning is nearly free
    (a no-op or cached tuner, under _CHEAP_TUNE_SECONDS): then a batch, so that the
    database, not fairness over nothing, sets the pace. The bound is absolute on purpose:
    a step's time grows with lock contention, and contention is exactly when real work
    must still be split evenly (a ratio alone made 16 loaded processes batch).
    """
    if not tuned:
        return 1
    tune_seconds = sum(p.tune_seconds for p in tuned) / len(tuned)
    if tune_seconds >= _CHEAP_TUNE_SECONDS or tune_seconds * 4 >= step_seconds:
        return 1
    return max(1, min(32, int(step_seconds / max(tune_seconds, 1e-6) / 4)))
