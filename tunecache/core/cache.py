"""The cache's protocol: claim -> tune -> publish, wait for peers, take over, fall back.

:class:`TuneCache` tunes opaque keys with a callable; it knows nothing of Inductor, so it
serves any autotuner. The guarantees:

- every distinct key is tuned once, by whoever claims it first; processes that ask for the
  same keys take them from the front of the list one at a time, so equal work splits evenly;
- no transaction is open while tuning; the owner's heartbeat renews its lease, and a peer
  takes over a key whose owner died or froze (its late publish is then rejected);
- every process returns the stored timings, so every process picks the same winner;
- a key whose tuner fails ``max_attempts`` times ends ``failed``, an answer, not a hang;
- any store failure logs one warning and the process tunes locally from then on.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import random
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import stored_json
from ..errors import InvalidEntryError, KeyFailedError, StoreError, TuneCacheError
from ..keys import (
    MAX_KEY_BYTES,
    Key,
    KeyLike,
    best_candidate,
    meta_to_json,
    timings_to_json,
    validate_meta,
    validate_timings,
)
from ..settings import MAX_LEASE_SECONDS, Settings
from ..store import Claim, ClaimStore, Database, Entry, Publication, ensure_schema
from .heartbeat import Heartbeat
from .result import Neighbour, Result, Source
from .usage import Usage

__all__ = ["TuneCache", "Tuner"]

logger = logging.getLogger("tunecache")

# A tuner gets the key mapping it was asked for (a Key's ``mapping``).
Tuner = Callable[[Mapping[str, Any]], Mapping[str, float]]

# How many keys one claim step looks at. Processes walk the key list in the same order, so
# the first free key is almost always within the first few; the window only bounds a read.
_CLAIM_WINDOW = 16
_USAGE_FLUSH_SECONDS = 60.0
_CHEAP_TUNE_SECONDS = 0.005


class TuneCache:
    """A process's handle on the shared cache. Safe across fork; one per process is enough."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._db = Database(settings.db_url, settings.lock_seconds,
                            readonly=settings.mode == "readonly",
                            own_directory=settings.owns_directory)
        self._store = ClaimStore(self._db)
        self._lock = threading.RLock()
        self._schema_pid = -1
        self._disabled: str | None = "TUNECACHE_MODE=off" if settings.mode == "off" else None
        self._warned_keys: set[str] = set()
        self._warned_neighbours = False
        self._owner_pid = -1
        self._owner = ""
        self._heartbeat: Heartbeat | None = None
        self._usage = Usage()
        _open_caches.add(self)

    # -- public API ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._db.display_url

    @property
    def disabled_reason(self) -> str | None:
        """Why this process tunes locally (None while the shared cache is in use)."""
        return self._disabled

    @property
    def store(self) -> ClaimStore:
        return self._store

    def database(self) -> Database | None:
        """The database at the head schema, for the services that share it (compiled
        graphs, tunecache.core.graphs); None while this process tunes locally (the store
        failed, or TUNECACHE_MODE=off), as the tuning protocol then does not use it either.
        """
        return self._db if self._ensure_available() else None

    def get_or_tune(self, key: KeyLike, tune: Callable[[], Mapping[str, float]]) -> Result:
        """The timings of ``key``, from the cache, a peer, or ``tune()``.

        Raises :class:`KeyFailedError` if the key is marked failed; whatever ``tune``
        raises propagates (the claim is given back first).
        """
        result = self.get_or_tune_many([key], lambda _key: tune())[0]
        if result.source == "failed":
            raise KeyFailedError(result.key_hash, self.settings.max_attempts, result.error)
        return result

    def get_or_tune_many(self, keys: Sequence[KeyLike], tune: Tuner) -> list[Result]:
        """Results for ``keys``, in their order; ``tune(key)`` tunes one key.

        Claims free keys one at a time (in list order, so processes calling with the same
        list share the work evenly) and tunes them, then waits on the database for keys
        that peers are tuning, taking over any whose owner's lease passes. A failed key
        gets a ``failed`` result rather than an exception, so the others are not lost.
        ``keys`` are mappings or :class:`~tunecache.keys.Key` objects.
        """
        asked = [Key.of(key) for key in keys]
        prepared: dict[str, Key] = {}
        for k in asked:
            prepared.setdefault(k.hash, k)
        results: dict[str, Result] = {}
        if self._ensure_available():
            try:
                if self.settings.mode == "readonly":
                    self._read_only(prepared, results)
                else:
                    self._claim_tune_wait(prepared, tune, results)
            except StoreError as e:
                self._disable(e)
        for k in prepared.values():
            if k.hash not in results:
                results[k.hash] = self._tune_locally(k, tune)
        self._usage.add(results.values())
        self._maybe_flush()
        return [results[k.hash] for k in asked]

    def lookup(self, key: KeyLike) -> Result | None:
        """The stored result of ``key`` if it is done and valid; never claims or waits."""
        row = self._read_row(key)
        if row is None or row.state != "done":
            return None
        result = self._result_from_row(row, "hit")
        if result is not None:
            self._usage.add([result])
        return result

    def neighbours(self, key: Key, limit: int = 64) -> list[Neighbour]:
        """Done entries of ``key``'s kind and family (other than ``key``), the most used
        first, each validated (an invalid one is skipped); empty without a family, or
        while the store is unavailable. Only reads."""
        kind = key.labels.get("kind")
        if key.family is None or kind is None or not self._ensure_available():
            return []
        try:
            rows = self._store.neighbours(kind, key.family, key.hash, limit)
        except StoreError as e:
            self._disable(e)
            return []
        found = []
        skipped = 0
        for key_hash, key_json, timings_json, meta_json in rows:
            try:
                # None: past the read's bound (claims.NEIGHBOUR_KEY_BYTES), or not text.
                mapping = stored_json.loads(key_json, MAX_KEY_BYTES) \
                    if key_json is not None else None
                timings = validate_timings(timings_json, key_hash)
            except (stored_json.StoredJSONError, InvalidEntryError):
                mapping = None
            if isinstance(mapping, dict):
                found.append(Neighbour(key_hash, mapping, timings, validate_meta(meta_json)))
            else:
                skipped += 1
        if skipped and not self._warned_neighbours:
            # Once per process: a family with planted rows is read by every new key.
            self._warned_neighbours = True
            logger.warning("tunecache: skipped %d neighbour entr%s of a %s key that could "
                           "not be read (too large or malformed); further ones are skipped "
                           "silently", skipped, "y" if skipped == 1 else "ies", kind[:40])
        return found

    def update_meta(self, key: KeyLike, **fields: Any) -> bool:
        """Add ``fields`` to a done entry's meta (its timings never change); False if the
        key is not done, the mode is not readwrite or the store is unavailable."""
        k = Key.of(key)
        if not self._ensure_available() or self.settings.mode != "readwrite":
            return False
        try:
            row = self._store.read([k.hash]).get(k.hash)
            if row is None or row.state != "done":
                return False
            meta = {**validate_meta(row.meta_json), **fields}
            return self._store.set_meta(k.hash, meta_to_json(meta))
        except StoreError as e:
            self._disable(e)
            return False

    def claim(
        self,
        key: KeyLike,
        *,
        lease_seconds: float | None = None,
        wait: float = 0.0,
    ) -> Result | Claim | None:
        """Claim ``key`` now and :meth:`publish` its timings later, from another call.

        For tuners that cannot run inside :meth:`get_or_tune`'s callable: Inductor's
        remote autotune cache asks for a key in one call (``get``) and hands the result
        over in another (``put``), possibly much later, possibly never. Returns

        - a :class:`Result` when the key is settled: ``hit`` (done before we asked),
          ``peer`` (a peer published it while we waited) or ``failed``;
        - a :class:`Claim`: this process owns the key; tune it and :meth:`publish`.
          Nothing renews it (no heartbeat: the caller may never publish), so after
          ``lease_seconds`` (default ``settings.lease_seconds``) a peer may take it
          over, and a late publish is then rejected. A publish after the lease passed
          but before anyone took over is still accepted;
        - ``None``: tune locally and publish nothing. The store is unavailable, the mode
          is readonly and the key is not done, the stored entry is invalid, or a peer
          still held a live claim after ``wait`` seconds.

        While waiting it only reads (no write transaction), and takes the key over as
        soon as the peer's lease passes.
        """
        k = Key.of(key)
        h = k.hash
        lease = self.settings.lease_seconds if lease_seconds is None else float(lease_seconds)
        if not math.isfinite(lease) or not 0 < lease <= MAX_LEASE_SECONDS:
            # Peers take a longer lease for one no tunecache wrote (claims.lease_passed).
            raise ValueError(f"lease_seconds must be a positive number of at most "
                             f"{MAX_LEASE_SECONDS:g}, not {lease_seconds!r}")
        if not self._ensure_available():
            return None
        deadline = time.monotonic() + max(0.0, wait)
        source: Source = "hit"
        poll = 0.01
        try:
            if self.settings.mode == "readonly":
                row = self._store.read([h]).get(h)
                return self._claim_answer(row, source)
            candidates = [k]
            while True:
                outcome = self._store.step(
                    publish=[],
                    candidates=candidates,
                    limit=1,
                    owner=self._owner_id(),
                    lease_seconds=lease,
                    max_attempts=self.settings.max_attempts,
                )
                if outcome.claimed:
                    return outcome.claimed[0]
                row = outcome.seen.get(h)
                if row is not None and (row.state != "claimed" or row.stranded):
                    return self._claim_answer(row, source)
                # A peer's live claim: read (no write transaction) until it settles or
                # its lease passes, then go round again to settle or take it over.
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self._store.wait_for_change(min(poll, left))
                    poll = min(poll * 2, 0.5)
                    row = self._store.read([h]).get(h)
                    if row is None or not row.live_claim:
                        break
                source = "peer"
        except StoreError as e:
            self._disable(e)
            return None

    def publish(
        self,
        claim: Claim,
        timings: Mapping[str, float],
        *,
        tune_seconds: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Result | None:
        """Publish the timings of a key claimed with :meth:`claim`.

        Returns the stored result (source ``tuned``), or None if the claim was lost (a
        peer took it over after the lease passed) or the store failed. Raises
        :class:`InvalidEntryError` for timings the cache would refuse to read back.
        """
        clean = validate_timings(dict(timings), claim.key_hash)
        if meta is None:
            meta = getattr(timings, "meta", None)
        meta_json = meta_to_json(meta)
        pub = Publication(claim, timings_to_json(clean), best_candidate(clean),
                          float(tune_seconds or 0.0), meta_json)
        if not self._ensure_available() or self.settings.mode != "readwrite":
            return None
        try:
            outcome = self._store.step(
                publish=[pub],
                candidates=[],
                limit=0,
                owner=claim.owner,
                lease_seconds=self.settings.lease_seconds,
                max_attempts=self.settings.max_attempts,
            )
        except StoreError as e:
            self._disable(e)
            return None
        if not outcome.published[0]:
            logger.warning(
                "tunecache: lost the claim on %s before publishing (its lease passed and a "
                "peer took it over); the peer's result is the one stored", claim.key_hash[:16]
            )
            return None
        result = Result(claim.key_hash, clean, pub.best, "tuned", tune_seconds,
                        meta=validate_meta(meta_json))
        self._usage.add([result])
        self._maybe_flush()
        return result

    def in_progress(self, key: KeyLike) -> bool:
        """Whether a live claim on ``key`` is held right now (by anyone); only reads."""
        row = self._read_row(key)
        return row is not None and row.live_claim

    def _read_row(self, key: KeyLike) -> Entry | None:
        """The stored row of ``key`` (None: absent, or the store is unavailable)."""
        if not self._ensure_available():
            return None
        try:
            h = Key.of(key).hash
            return self._store.read([h]).get(h)
        except StoreError as e:
            self._disable(e)
            return None

    def release(self, claim: Claim, error: str, *, failed: bool = True) -> None:
        """Give back a key claimed with :meth:`claim` that will not be published.

        Waiting peers take it at once instead of after the lease. It counts as a failed
        attempt (``error`` says why), so a key that never gets a result ends ``failed``;
        ``failed=False``: the tuning was stopped because it was not needed, and it does
        not count.
        """
        if not self._ensure_available():
            return
        try:
            self._store.release(claim, error, self.settings.max_attempts, failed=failed)
        except StoreError as e:
            self._disable(e)

    def _claim_answer(self, row: Entry | None, source: Source) -> Result | None:
        """:meth:`claim`'s answer for a row it did not claim (None: tune locally)."""
        if row is None:
            return None
        if row.stranded:
            self._warn_stranded(row)
            return None
        results: dict[str, Result] = {}
        self._settle(row, source, results)
        result = results.get(row.key_hash)
        if result is not None and result.source != "failed":
            self._usage.add([result])
        return result

    def note_graph_use(self, kind: str, key: str) -> None:
        """A compiled graph was loaded from the database: counted, and written with the
        usage counters (as hits are, so that a load stays a read)."""
        self._usage.add_graph(kind, key)
        self._maybe_flush()

    def flush_usage(self) -> None:
        """Write the hit counts and the usage row gathered so far (one transaction), and
        the compiled graphs' loads (another)."""
        if self.settings.mode != "readwrite" or self._disabled:
            self._usage.take()
            self._usage.take_graphs()
            return
        hits, counts = self._usage.take()
        graphs = self._usage.take_graphs()
        try:
            if hits or any(counts.values()):
                self._store.record_usage(hits, counts)
            if graphs:
                from ..store.artifacts import ArtifactStore  # SQLAlchemy: first use only

                ArtifactStore(self._db).record_uses(graphs)
        except StoreError as e:
            logger.debug("tunecache: usage not recorded: %s", e)

    def release_connections(self) -> None:
        """Close the database connections this process holds; the next call opens anew.

        For callers that must not hold a connection between calls far apart (Inductor's
        compile workers, one lookup per kernel).
        """
        self._db.dispose()

    def close(self) -> None:
        self.flush_usage()
        if self._heartbeat is not None and self._heartbeat.pid == os.getpid():
            self._heartbeat.stop()
        self._heartbeat = None
        self._db.dispose()

    def __enter__(self) -> TuneCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- availability --------------------------------------------------------------------

    def _ensure_available(self) -> bool:
        if self._disabled:
            return False
        pid = os.getpid()
        if self._schema_pid == pid:
            return True
        with self._lock:
            if self._schema_pid != pid and not self._disabled:
                try:
                    ensure_schema(self._db, may_migrate=self.settings.mode == "readwrite")
                    self._schema_pid = pid
                except TuneCacheError as e:
                    self._disable(e)
        return not self._disabled

    def _disable(self, error: BaseException) -> None:
        with self._lock:
            if self._disabled:
                return
            self._disabled = str(error)
        logger.warning("tunecache: %s; tuning locally in this process from now on", error)

    def _owner_id(self) -> str:
        pid = os.getpid()
        if self._owner_pid != pid:
            self._owner = f"{socket.gethostname()[:200]}:{pid}:{uuid.uuid4().hex[:8]}"
            self._owner_pid = pid
        return self._owner

    # -- the protocol --------------------------------------------------------------------

    def _read_only(self, keys: Mapping[str, Key], results: dict[str, Result]) -> None:
        for h, row in self._store.read(list(keys)).items():
            if row.state == "done":
                result = self._result_from_row(row, "hit")
                if result is not None:
                    results[h] = result

    def _claim_tune_wait(
        self, keys: Mapping[str, Key], tune: Tuner, results: dict[str, Result]
    ) -> None:
        owner = self._owner_id()
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
                        self._warn_stranded(row)  # left to the local fallback
                    elif not self._settle(row, "hit", results):
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
                    self._warn_stranded(row)  # left to the local fallback
                    progressed = True
                elif self._settle(row, "peer", results):
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
            if (publications or rest) and not self._disabled:
                self._store.step(
                    publish=publications, give_back=rest, candidates=[], limit=0,
                    owner=self._owner_id(), lease_seconds=self.settings.lease_seconds,
                    max_attempts=self.settings.max_attempts,
                )
        except StoreError as e:
            self._disable(e)
        finally:
            heartbeat.release(pub.claim for pub in publications)

    def _warn_stranded(self, row: Entry) -> None:
        if row.key_hash not in self._warned_keys:
            self._warned_keys.add(row.key_hash)
            logger.warning("tunecache: key %s is %s, so no process will finish it; "
                           "tuning it locally", row.key_hash[:16], row.stranded)

    def _settle(self, row: Entry, source: Source, results: dict[str, Result]) -> bool:
        """Record a finished row's result; False while it is still being tuned."""
        if row.state == "done":
            result = self._result_from_row(row, source)
            if result is not None:
                results[row.key_hash] = result
            return True  # an invalid entry is left to the local fallback
        if row.state == "failed":
            results[row.key_hash] = Result(
                row.key_hash, {}, None, "failed", error=row.error or "failed"
            )
            return True
        return False

    def _result_from_row(self, row: Entry, source: Source) -> Result | None:
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
            tuned = tune(key.mapping)
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

    def _tune_locally(self, key: Key, tune: Tuner) -> Result:
        start = time.perf_counter()
        tuned = tune(key.mapping)
        clean = {name: (ms if isinstance(ms, (int, float)) and not math.isnan(ms) else math.inf)
                 for name, ms in dict(tuned).items()}
        return Result(key.hash, clean, best_candidate(clean), "local",
                      time.perf_counter() - start, meta=dict(getattr(tuned, "meta", {}) or {}))

    def _heartbeat_thread(self) -> Heartbeat:
        if self._heartbeat is None or self._heartbeat.pid != os.getpid():
            self._heartbeat = Heartbeat(self._store, self.settings.lease_seconds)
        return self._heartbeat

    def _maybe_flush(self) -> None:
        if self._usage.age() > _USAGE_FLUSH_SECONDS:
            self.flush_usage()


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


_open_caches: weakref.WeakSet[TuneCache] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for cache in list(_open_caches):
        try:
            cache.flush_usage()
        except Exception:  # noqa: BLE001 - never fail interpreter shutdown
            pass
