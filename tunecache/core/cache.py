"""The cache's public API, :class:`TuneCache`: get or tune keys, look them up, claim and
publish one key at a time, count usage.

:class:`TuneCache` tunes opaque keys with a callable; it knows nothing of Inductor, so it
serves any autotuner. The claim protocol is :mod:`tunecache.core.claimant`'s, the failure
policy :mod:`tunecache.core.availability`'s. The guarantees:

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
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import stored_json
from ..errors import InvalidEntryError, KeyFailedError, StoreError
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
from ..store import Claim, ClaimStore, Database, Entry, Publication, earlier_queries
from ..store.reclaim import reclaim
from .availability import Availability
from .claimant import Claimant, Tuner
from .result import Neighbour, Result, Source
from .usage import Usage

__all__ = ["TuneCache"]

logger = logging.getLogger("tunecache")

_USAGE_FLUSH_SECONDS = 60.0


class TuneCache:
    """A process's handle on the shared cache. Safe across fork; one per process is enough."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._db = Database(settings.db_url, settings.lock_seconds,
                            readonly=settings.mode == "readonly",
                            own_directory=settings.owns_directory)
        self._store = ClaimStore(self._db)
        self._available = Availability(self._db, settings)
        self._claimant = Claimant(self._store, settings, self._available)
        self._warned_neighbours = False
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
        return self._available.reason

    @property
    def store(self) -> ClaimStore:
        return self._store

    def database(self) -> Database | None:
        """The database at the head schema, for the services that share it (compiled
        graphs, tunecache.core.graphs); None while this process tunes locally (the store
        failed, or TUNECACHE_MODE=off), as the tuning protocol then does not use it either.
        """
        return self._db if self._available.ensure() else None

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
        if self._available.ensure():
            try:
                if self.settings.mode == "readonly":
                    self._read_only(prepared, results)
                else:
                    self._claimant.claim_tune_wait(prepared, tune, results)
            except StoreError as e:
                self._available.disable(e)
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
        result = self._claimant.result_from_row(row, "hit")
        if result is not None:
            self._usage.add([result])
        return result

    def neighbours(self, key: Key, limit: int = 64) -> list[Neighbour]:
        """Done entries of ``key``'s kind and family (other than ``key``), the most used
        first, each validated (an invalid one is skipped); empty without a family, or
        while the store is unavailable. Only reads."""
        kind = key.labels.get("kind")
        if key.family is None or kind is None or not self._available.ensure():
            return []
        try:
            rows = self._store.neighbours(kind, key.family, key.hash, limit)
        except StoreError as e:
            self._available.disable(e)
            return []
        return self._read_neighbours(rows, kind)

    def _read_neighbours(self, rows: Sequence[tuple[str, str | None, str | None, str | None]],
                         kind: str) -> list[Neighbour]:
        """Each row (key hash, key, timings, meta: untrusted text) validated as a
        :class:`Neighbour`; an invalid one is skipped, with one warning per process."""
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

    def recorded_versions(self, kind: str, device: str,
                          limit: int = 32) -> list[tuple[str, str]]:
        """The (torch, triton) versions that done entries of ``kind`` on ``device`` were
        recorded under, at most ``limit`` of them (tunecache.store.earlier_queries); empty
        while the store is unavailable. Only reads."""
        if not self._available.ensure():
            return []
        try:
            rows = earlier_queries.recorded_versions(self._db, kind, device, limit)
        except StoreError as e:
            self._available.disable(e)
            return []
        return [(torch, triton) for torch, triton in rows
                if torch is not None and triton is not None]

    def entries_of_op(self, kind: str, op: str, device: str, versions: tuple[str, str],
                      limit: int = 64) -> list[Neighbour]:
        """Done entries of ``kind`` and ``op`` on ``device`` recorded under ``versions``
        (torch, triton), validated as :meth:`neighbours` are; at most ``limit``, empty
        while the store is unavailable. Only reads."""
        if not self._available.ensure():
            return []
        try:
            rows = earlier_queries.entries_of_op(self._db, kind, op, device, versions, limit)
        except StoreError as e:
            self._available.disable(e)
            return []
        return self._read_neighbours(rows, kind)

    def keys_of_version(self, kind: str, device: str, versions: tuple[str, str],
                        limit: int = 4) -> list[dict[str, Any]]:
        """Up to ``limit`` key mappings of done entries of ``kind`` on ``device`` under
        ``versions`` (torch, triton): what a key of that version looked like (its other
        library versions). An unreadable one is skipped. Only reads."""
        if not self._available.ensure():
            return []
        try:
            texts = earlier_queries.keys_of_version(self._db, kind, device, versions, limit)
        except StoreError as e:
            self._available.disable(e)
            return []
        found = []
        for text in texts:
            try:
                mapping = stored_json.loads(text, MAX_KEY_BYTES)
            except stored_json.StoredJSONError:
                continue
            if isinstance(mapping, dict):
                found.append(mapping)
        return found

    def recorded(self, keys: Sequence[Key]) -> list[Neighbour]:
        """The done entries of ``keys`` that validate, in ``keys``' order, as
        :class:`Neighbour` objects; read without a claim, a wait or a hit counted (they
        are where another key starts, not answers). Only reads."""
        if not keys or not self._available.ensure():
            return []
        try:
            rows = self._store.read([k.hash for k in keys])
        except StoreError as e:
            self._available.disable(e)
            return []
        found = []
        for k in keys:
            row = rows.get(k.hash)
            if row is None or row.state != "done":
                continue
            try:
                timings = validate_timings(row.timings_json, k.hash)
            except InvalidEntryError:
                continue
            found.append(Neighbour(k.hash, dict(k.mapping), timings,
                                   validate_meta(row.meta_json)))
        return found

    def update_meta(self, key: KeyLike, **fields: Any) -> bool:
        """Add ``fields`` to a done entry's meta (its timings never change); False if the
        key is not done, the mode is not readwrite or the store is unavailable."""
        k = Key.of(key)
        if not self._available.ensure() or self.settings.mode != "readwrite":
            return False
        try:
            row = self._store.read([k.hash]).get(k.hash)
            if row is None or row.state != "done":
                return False
            meta = {**validate_meta(row.meta_json), **fields}
            return self._store.set_meta(k.hash, meta_to_json(meta))
        except StoreError as e:
            self._available.disable(e)
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
        if not self._available.ensure():
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
                    owner=self._claimant.owner_id(),
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
            self._available.disable(e)
            return None

    def reclaim(self, key: KeyLike, found: Result) -> Result | Claim | None:
        """Claim ``key`` again to replace its done entry, which the caller read as
        ``found`` and cannot use (it names none of the caller's candidates: a planted or
        foreign decision); tune it and :meth:`publish`. Returns a :class:`Claim`; the
        entry that replaced ``found`` meanwhile (a :class:`Result`, source ``peer``); or
        None: tune locally (the store is unavailable or not writable, the row is not
        ``found`` any more and not done, or a peer re-claimed it first)."""
        k = Key.of(key)
        if not self._available.ensure() or self.settings.mode != "readwrite":
            return None
        try:
            row = self._store.read([k.hash]).get(k.hash)
            if row is None or row.state != "done":
                return None
            now = self._claimant.result_from_row(row, "peer")
            if now is None or (now.timings, dict(now.meta)) != (found.timings,
                                                                 dict(found.meta)):
                return now
            return reclaim(self._db, row, self._claimant.owner_id(),
                           self.settings.lease_seconds)
        except StoreError as e:
            self._available.disable(e)
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
        if not self._available.ensure() or self.settings.mode != "readwrite":
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
            self._available.disable(e)
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
        if not self._available.ensure():
            return None
        try:
            h = Key.of(key).hash
            return self._store.read([h]).get(h)
        except StoreError as e:
            self._available.disable(e)
            return None

    def release(self, claim: Claim, error: str, *, failed: bool = True) -> None:
        """Give back a key claimed with :meth:`claim` that will not be published.

        Waiting peers take it at once instead of after the lease. It counts as a failed
        attempt (``error`` says why), so a key that never gets a result ends ``failed``;
        ``failed=False``: the tuning was stopped because it was not needed, and it does
        not count.
        """
        if not self._available.ensure():
            return
        try:
            self._store.release(claim, error, self.settings.max_attempts, failed=failed)
        except StoreError as e:
            self._available.disable(e)

    def _claim_answer(self, row: Entry | None, source: Source) -> Result | None:
        """:meth:`claim`'s answer for a row it did not claim (None: tune locally)."""
        if row is None:
            return None
        if row.stranded:
            self._claimant.warn_stranded(row)
            return None
        results: dict[str, Result] = {}
        self._claimant.settle(row, source, results)
        result = results.get(row.key_hash)
        if result is not None and result.source != "failed":
            self._usage.add([result])
        return result

    def note_artifact_use(self, kind: str, key: str) -> None:
        """A compiled artifact (graph or kernel) was loaded from the database: counted, and
        written with the usage counters (as hits are, so that a load stays a read)."""
        self._usage.add_artifact_use(kind, key)
        self._maybe_flush()

    def flush_usage(self) -> None:
        """Write the hit counts and the usage row gathered so far (one transaction), and
        the compiled artifacts' loads (another)."""
        if self.settings.mode != "readwrite" or self._available.reason:
            self._usage.take()
            self._usage.take_artifact_uses()
            return
        hits, counts = self._usage.take()
        artifact_uses = self._usage.take_artifact_uses()
        try:
            if hits or any(counts.values()):
                self._store.record_usage(hits, counts)
            if artifact_uses:
                from ..store.artifacts import ArtifactStore  # SQLAlchemy: first use only

                ArtifactStore(self._db).record_uses(artifact_uses)
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
        self._claimant.stop()
        self._db.dispose()

    def __enter__(self) -> TuneCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- readonly mode and the local fallback --------------------------------------------

    def _read_only(self, keys: Mapping[str, Key], results: dict[str, Result]) -> None:
        for h, row in self._store.read(list(keys)).items():
            if row.state == "done":
                result = self._claimant.result_from_row(row, "hit")
                if result is not None:
                    results[h] = result

    def _tune_locally(self, key: Key, tune: Tuner) -> Result:
        start = time.perf_counter()
        tuned = tune(key)
        clean = {name: (ms if isinstance(ms, (int, float)) and not math.isnan(ms) else math.inf)
                 for name, ms in dict(tuned).items()}
        return Result(key.hash, clean, best_candidate(clean), "local",
                      time.perf_counter() - start, meta=dict(getattr(tuned, "meta", {}) or {}))

    def _maybe_flush(self) -> None:
        if self._usage.age() > _USAGE_FLUSH_SECONDS:
            self.flush_usage()


_open_caches: weakref.WeakSet[TuneCache] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for cache in list(_open_caches):
        try:
            cache.flush_usage()
        except Exception:  # noqa: BLE001 - never fail interpreter shutdown
            pass
