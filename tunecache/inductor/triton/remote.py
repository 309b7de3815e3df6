"""The remote autotune-cache adapter: Inductor's ``RemoteAutotuneCache`` get/put of a
Triton kernel's best config, and the claims around coordinate descent and fusion
benchmarks, over the shared TuneCache; and the one warning per part of Triton sharing that
fails (``TritonCache.warn_once``, and ``TritonCache.attempt``, the guard that reports to it)."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ... import keys as tc_keys
from ... import stored_json
from ..state import REGISTRY
from ..transfer import AGREE
from .attempt import Attempt
from .kernel_keys import (
    FAMILY_FIELD,
    NO_SAVE_HEURISTICS,
    SIZES_FIELD,
    config_text,
    coordesc_result,
    fusion_ms_from_entry,
    nearest_results,
    results_agreement,
    triton_config_from_entry,
    triton_entry_problem,
    triton_key,
)
from .signals import released_as
from .upgrade import TritonUpgrades

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...core.cache import TuneCache

__all__ = ["TRITON_LEASE_SECONDS", "TritonCache", "remote_cache_class"]

log = logging.getLogger("tunecache")


# A kernel's config is decided without measuring (Settings.decisive, "triton") only where
# this many of its nearest neighbours, or all it has if fewer, found the same one.
DECIDING_NEIGHBOURS = 3

# The lease of the claim a save takes just before it publishes (the two are back to back;
# only a process killed between them leaves the claim, which then expires).
TRITON_LEASE_SECONDS = 60.0


# The fields of a Triton key that its family (keys.triton_kernel_info) hashes too.
_FAMILY_KEY_FIELDS = ("kind", "env", "device_type", "heuristic", "coordesc", "tag")

class TritonCache:
    """get/put of Inductor's remote autotune cache, over the shared TuneCache.

    get (at kernel load, in this process or a compile worker): a stored, valid best config
    -> it; else None, and Inductor tunes the kernel at its first run. It never claims or
    waits (see the notes in triton/install.py). plan_coordesc (at the first run, before
    coordinate descent): adopt, claim, or defer to a peer. put (at the first run, always in the
    compiling process): publish under plan_coordesc's claim, or claim the key and publish
    at once, unless it is done already. With
    coordinate descent on, Inductor saves twice per kernel (the autotune_to_one_config
    winner, then the coordinate descent result); entries are immutable, so the first is
    held back until the second replaces it, or until this thread moves on to another
    kernel.

    ``cache`` returns the TuneCache to use (opened lazily). ``worker``: this process is a
    compile worker, which only reads; it drops its connection after each read, because
    every rank has up to 32 workers and a PostgreSQL server has ~100 connections.
    """

    def __init__(self, cache: Callable[[], TuneCache], *, worker: bool = False) -> None:
        self.cache = cache
        self.worker = worker
        self._lock = threading.Lock()
        # key hash -> (thread, key, the saved dict, the entry's meta)
        self._held: dict[str, tuple[int, tc_keys.Key, dict[str, Any], dict[str, Any]]] = {}
        # key hash -> meta for the entry this process is about to publish (coordesc.py:
        # the baseline, the winner's time, where a transfer came from)
        self._meta: dict[str, dict[str, Any]] = {}
        self._claims: dict[str, Any] = {}  # key hash -> Claim, from plan_coordesc to put
        # thread -> key hash of a claim plan_coordesc(ahead=True) took for the coordinate
        # descent that follows on that thread
        self._claimed_ahead: dict[int, str] = {}
        self._unpublished: set[str] = set()  # plan_coordesc's claims whose publish failed
        self._warned: set[str] = set()
        # Kernels (key hashes) whose stored config this process refused, or saw fail to
        # compile or launch: Inductor tunes them here, and nothing adopts that entry.
        self._refused: set[str] = set()
        self._reasons: set[str] = set()  # reasons already warned about, once each
        # .served: key text of this thread's last hit; .served_best: a copy of what it
        # handed Inductor (which pops fields from the dict it gets)
        self._local = threading.local()
        self.upgrades = TritonUpgrades()

    @staticmethod
    def _info(key_text: str) -> dict[str, Any]:
        try:
            info = stored_json.loads(key_text, tc_keys.MAX_KEY_BYTES)
        except stored_json.StoredJSONError:
            info = None
        if not isinstance(info, dict) or "kernel" not in info:
            # Inductor's own key (the re-keying wrapper did not run): correct, but it
            # hashes the device index, so ranks on other GPUs do not share it.
            info = {"kernel": key_text}
        return info

    def _key(self, inductor_key: str, key_text: str) -> tuple[dict[str, Any], tc_keys.Key]:
        """(info, Key) of the kernel Inductor names by these two strings: the key hashed
        once, with the kernel's family where its key text has one (a kernel keyed before
        transfer, or by Inductor's own key, has none)."""
        info = self._info(key_text)
        family = info.get(FAMILY_FIELD)
        valid = isinstance(family, str) and 0 < len(family) <= tc_keys.MAX_FAMILY \
            and family.isalnum()
        return info, tc_keys.Key.of(triton_key(inductor_key, info),
                                    family=family if valid else None)

    def note_meta(self, inductor_key: str, key_text: str, **fields: Any) -> None:
        """Meta for the coordinate-descent result of this kernel that this process is
        about to save (coordesc.py): :meth:`_publish` stores it with the entry."""
        key_hash = self._key(inductor_key, key_text)[1].hash
        with self._lock:
            self._meta.setdefault(key_hash, {}).update(fields)

    def drop_meta(self, inductor_key: str, key_text: str) -> None:
        """Forget :meth:`note_meta`'s fields of a kernel whose save did not follow."""
        key_hash = self._key(inductor_key, key_text)[1].hash
        with self._lock:
            self._meta.pop(key_hash, None)

    def transfer_config_failed(self, inductor_key: str, key_text: str,
                               error: BaseException) -> None:
        """A neighbour's config that raised when compiled or benchmarked for this kernel
        (coordesc.py): skipped; one warning per process."""
        _, key = self._key(inductor_key, key_text)
        REGISTRY.triton_stats.add(transfer_failed=1)
        level = logging.WARNING if self._once("transfer failed") else logging.DEBUG
        log.log(level, "tunecache: a neighbour's Triton config failed for kernel %s (%s: %s); "
                "it is skipped (further failures are logged at debug level)",
                key["op"], type(error).__name__, str(error)[:300])

    def transfer_sources(self, inductor_key: str, key_text: str,
                         limit: int = 2) -> list[tuple[str, dict[str, Any]]]:
        """The stored coordinate-descent results of this kernel's nearest neighbours:
        (their key hash, their best-config dict), nearest first, at most ``limit`` and
        no two the same config. Neighbours are the done entries of the kernel's family
        (the same kernel at other sizes, same device and versions) whose sizes
        (meta "sizes") are within :data:`.keys.TRITON_MAX_OCTAVES` in every dimension. Whatever
        a neighbour holds is checked (:func:`.keys.coordesc_result`); one that does not
        pass is skipped. After an upgrade the kernel's own records under the newest older
        version that has one come first (:mod:`.upgrade`)."""
        chosen: list[tuple[str, dict[str, Any]]] = []
        seen: set[str] = set()
        for key_hash, best, _ in [*self._upgrade_sources(inductor_key, key_text),
                                  *self._nearest(inductor_key, key_text)]:
            config = config_text(best)
            if config not in seen:
                seen.add(config)
                chosen.append((key_hash, best))
            if len(chosen) >= limit:
                break
        return chosen

    def decided_by_neighbours(self, inductor_key: str, key_text: str
                              ) -> tuple[dict[str, Any], list[str]] | None:
        """With ``Settings.decisive``'s ``triton`` part: (the best-config dict, the key
        hashes it comes from) where this kernel's nearest neighbours, up to
        :data:`DECIDING_NEIGHBOURS`, all tuned in full (not by transfer), all found the
        same config; else None. The kernel then loads that one config as if it were
        stored (stored.py), and its first run publishes it under a claim (coordesc.py),
        so every rank runs the config the first one published."""
        settings = self.cache().settings
        if not (settings.shares("transfer") and "triton" in settings.levers.decisive):
            return None
        nearest = self._nearest(inductor_key, key_text)[:DECIDING_NEIGHBOURS]
        if not nearest:
            return None
        agreement = results_agreement(nearest)
        if agreement.verdict != AGREE:
            return None
        return agreement.choice, [key_hash for key_hash, _, _ in nearest]

    def _nearest(self, inductor_key: str, key_text: str
                 ) -> list[tuple[str, dict[str, Any], Mapping[str, Any]]]:
        """(key hash, best-config dict, meta) of each neighbour (:meth:`transfer_sources`),
        nearest first."""
        info, key = self._key(inductor_key, key_text)
        sizes = _valid_sizes(info.get(SIZES_FIELD))
        if key.family is None or not sizes:
            return []
        with self._lock:
            refused = set(self._refused)
        with self._reading() as cache:
            found = cache.neighbours(key)
        # A neighbour by its own key as far as the key tells the family (all it hashes but
        # the sizeless source), not only by the family column its writer filled in.
        ours = key.mapping
        return nearest_results(sizes, [
            n for n in found if n.key_hash not in refused
            and all(n.key.get(f) == ours.get(f) for f in _FAMILY_KEY_FIELDS)])

    def _upgrade_sources(self, inductor_key: str, key_text: str
                         ) -> list[tuple[str, dict[str, Any], Mapping[str, Any]]]:
        """This kernel's own records under an older torch/Triton (:mod:`.upgrade`)."""
        info, key = self._key(inductor_key, key_text)
        sizes = _valid_sizes(info.get(SIZES_FIELD))
        if not sizes:
            return []
        with self._lock:
            refused = set(self._refused)
        with self._reading() as cache:
            return self.upgrades.sources(cache, key, sizes, refused)

    def upgraded_from(self, key_hashes: list[str]) -> dict[str, str] | None:
        """The library versions of the first of ``key_hashes`` that was an older version's
        record (:mod:`.upgrade`), or None."""
        return self.upgrades.from_version(key_hashes)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[TuneCache]:
        """The cache, for a read; in a compile worker its connection is closed after."""
        cache = self.cache()
        try:
            yield cache
        finally:
            if self.worker:
                cache.release_connections()

    def _stored_best(self, key: Mapping[str, Any]
                     ) -> tuple[bool, dict[str, Any] | None, str | None, str]:
        """(found, best config, why it is refused, the stored text): whether a done entry
        is stored, and its config if valid, else the reason."""
        with self._reading() as cache:
            answer = cache.lookup(key)
        if answer is None or answer.source == "failed":
            return False, None, None, ""
        return (True, *triton_entry_problem(answer.timings), " ".join(answer.timings))

    def _once(self, reason: str) -> bool:
        with self._lock:
            first = reason not in self._reasons
            self._reasons.add(reason)
        return first

    def refuse(self, inductor_key: str, key_text: str, reason: str, config: Any) -> None:
        """A stored config that is not one this kernel could have (``reason``, from
        triton/kernel_keys.py): this process leaves the entry alone and Inductor tunes the
        kernel. One warning per reason, not one per kernel."""
        _, key = self._key(inductor_key, key_text)
        key_hash = key.hash
        served = getattr(self._local, "served", None) == key_text
        self._local.served = None
        with self._lock:
            self._refused.add(key_hash)
        # Counted as a hit when get() returned it; it is not one.
        REGISTRY.triton_stats.add(invalid=1, hits=-1 if served else 0)
        level = logging.WARNING if self._once(reason) else logging.DEBUG
        log.log(level, "tunecache: stored Triton configs refused: %s (first: %s, %s); "
                "Inductor tunes such kernels as usual, and the entries stay in the database "
                "(further refusals for this reason are logged at debug level)",
                reason, key["op"], describe_config(config))

    def stored_config_failed(self, inductor_key: str, key_text: str, doing: str,
                             error: BaseException) -> None:
        """A stored config that raised while ``doing`` ("compiling", "launching"): from
        now on this process tunes the kernel as without the entry. One warning per
        ``doing``."""
        _, key = self._key(inductor_key, key_text)
        key_hash = key.hash
        with self._lock:
            self._refused.add(key_hash)
        REGISTRY.triton_stats.add(stored_config_failed=1)
        level = logging.WARNING if self._once(f"failed {doing}") else logging.DEBUG
        log.log(level, "tunecache: a stored Triton config failed %s (%s: %s; kernel %s); "
                "Inductor tunes the kernel as without tunecache (further failures %s a "
                "stored config are logged at debug level)",
                doing, type(error).__name__, str(error)[:300], key["op"], doing)

    def warn_once(self, what: str, error: BaseException) -> None:
        REGISTRY.triton_stats.add(errors=1)
        with self._lock:
            first = what not in self._warned
            self._warned.add(what)
        if first:
            log.warning(
                "tunecache: %s failed (%s: %s); Inductor autotunes that Triton kernel as "
                "usual (further failures are logged at debug level)",
                what, type(error).__name__, error,
            )
        else:
            log.debug("tunecache: %s failed again: %r", what, error)

    def attempt(self, what: str) -> Attempt:
        """A guard (:class:`.attempt.Attempt`) around a part of Triton sharing that
        Inductor can do without: an error in it is :meth:`warn_once`'s, under ``what``."""
        return Attempt(what, self.warn_once)

    # -- Inductor's calls

    def get(self, inductor_key: str, key_text: str) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        REGISTRY.triton_stats.add(lookups=1)
        try:
            # An error here would fail the kernel load.
            with self.attempt("reading a Triton kernel's best config"):
                self.flush(threading.get_ident())
                return self._get(inductor_key, key_text)
            return None
        finally:
            REGISTRY.triton_stats.add(wait_seconds=time.perf_counter() - t0)

    def put(self, inductor_key: str, key_text: str, value: Any) -> None:
        REGISTRY.triton_stats.add(puts=1)
        # An error here would fail the kernel run.
        with self.attempt("publishing a Triton kernel's best config"):
            self._put(inductor_key, key_text, value)

    def flush(self, thread: int | None = None) -> None:
        """Publish held results (of one thread, or all)."""
        with self._lock:
            ready = [h for h, (t, *_) in self._held.items() if thread is None or t == thread]
            items = [self._held.pop(h) for h in ready]
        for _, key, value, meta in items:
            with self.attempt("publishing a Triton kernel's best config"):  # see put()
                self._publish(key, value, meta)

    # -- the protocol

    def _get(self, inductor_key: str, key_text: str) -> dict[str, Any] | None:
        _, key = self._key(inductor_key, key_text)
        key_hash = key.hash
        self._local.served = None
        with self._lock:
            refused = key_hash in self._refused
        if refused:
            REGISTRY.triton_stats.add(invalid=1)
            return None
        found, best, problem, text = self._stored_best(key)
        if not found:
            REGISTRY.triton_stats.add(misses=1)
            return None
        if best is None:
            self.refuse(inductor_key, key_text, problem or "not a config", text)
            return None
        REGISTRY.triton_stats.add(hits=1)
        self._local.served = key_text
        self._local.served_best = dict(best)
        return best

    def served(self, key_text: str) -> dict[str, Any] | None:
        """The stored config this thread's last hit handed Inductor for ``key_text``
        (a copy), or None where that hit was for another key or there was none."""
        if getattr(self._local, "served", None) != key_text:
            return None
        best: dict[str, Any] | None = getattr(self._local, "served_best", None)
        return best

    def plan_coordesc(
        self, inductor_key: str, key_text: str, *, waits: bool, ahead: bool = False
    ) -> tuple[str, dict[str, Any] | None]:
        """What a kernel's run does instead of, or around, coordinate descent.

        ``("adopt", best)``: the store has the coordinate-descent result; run it.
        ``("tune", None)``: this process claimed the key; tune and publish it.
        ``("defer", None)``: a peer is tuning it; launch it untuned and ask again at a
        later run. ``("local", None)``: tune here without the cache (store down,
        readonly, a failed or invalid entry, or a peer's result that never came).
        ``waits``: wait for a peer's result rather than defer (a kernel that cannot be
        deferred, or one whose timing decides a benchmark). ``ahead``: asked before
        autotune_to_one_config's benchmark, which only the tuning rank needs: a claim
        taken then is this thread's for the coordinate descent that follows, so a peer
        at the same kernel at the same moment skips that benchmark too. Should another
        kernel be planned on this thread first (a caller that tunes no further), the
        claim is given back then.
        """
        _, key = self._key(inductor_key, key_text)
        key_hash = key.hash
        thread = threading.get_ident()
        with self._lock:
            # The autotune_to_one_config save held for this key: coordinate descent
            # decides now, and its result (ours or a peer's) is the one that counts.
            self._held.pop(key_hash, None)
            early = self._claimed_ahead.pop(thread, None)
            if early == key_hash and key_hash in self._claims:
                return "tune", None
        if early is not None and early != key_hash:
            self._release(early, "no coordinate descent followed its configs' benchmark",
                          failed=False)
        with self._lock:
            if key_hash in self._refused:  # tuned here, as without the entry
                return "local", None
        state, value = self._claim_step(key, waits, coordesc_result)
        if state == "claimed":
            with self._lock:
                self._claims[key_hash] = value
                if ahead:
                    self._claimed_ahead[thread] = key_hash
            return "tune", None
        return {"done": "adopt", "busy": "defer"}.get(state, "local"), value

    def _claim_step(
        self, key: tc_keys.KeyLike, waits: bool, read: Callable[[Mapping[str, float]], Any],
        *, again: bool = True,
    ) -> tuple[str, Any]:
        """Where ``key`` stands, claiming it if it is free: ``("done", read(timings))``
        for a stored entry that ``read`` accepts (not None); ``("claimed", claim)``: this
        process is to measure and publish it; ``("busy", None)``: a peer holds it (only
        when not ``waits``, else this waits out the peer's claim, one lease at most);
        ``("local", None)``: measure without sharing (store down or readonly, a failed or
        refused entry, or a peer's result that never came). ``again``: look once more
        if the peer's claim that the claim found is gone by the time it is checked."""
        from tunecache import Result  # lazy: the core imports SQLAlchemy

        cache = self.cache()
        answer: Any = cache.lookup(key)
        if answer is None:
            t0 = time.perf_counter()
            answer = cache.claim(key, lease_seconds=TRITON_LEASE_SECONDS,
                                 wait=TRITON_LEASE_SECONDS + 5.0 if waits else 0.0)
            if waits:
                REGISTRY.triton_stats.add(peer_wait_seconds=time.perf_counter() - t0)
        if isinstance(answer, Result):
            value = None if answer.source == "failed" else read(answer.timings)
            return ("local", None) if value is None else ("done", value)
        if answer is not None:
            return "claimed", answer
        if waits:
            return "local", None
        if cache.in_progress(key):
            return "busy", None
        if again:
            # The claim found a peer's claim, which has ended since: ranks in step reach a
            # kernel just as the peer that claimed it publishes it. Look again rather than
            # measure what the peer has just published (this made a two-process test flaky).
            return self._claim_step(key, waits, read, again=False)
        return "local", None

    def release_claim(self, inductor_key: str, key_text: str,
                      error: BaseException | str) -> None:
        """Give back this process's claim on a kernel if it was not published.
        ``error``: what stopped the tuning (:func:`released_as`)."""
        # Called on Inductor's paths, even its errors'.
        with self.attempt("giving back a Triton kernel's claim"):
            text, failed = released_as(error)
            self._release(self._key(inductor_key, key_text)[1].hash, text, failed=failed)

    def _release(self, key_hash: str, error: str, *, failed: bool = True) -> None:
        with self._lock:
            claim = self._claims.pop(key_hash, None)
            for thread, held in list(self._claimed_ahead.items()):
                if held == key_hash:
                    del self._claimed_ahead[thread]
        if claim is not None:
            self.cache().release(claim, error, failed=failed)

    def _put(self, inductor_key: str, key_text: str, value: Any) -> None:
        if not isinstance(value, dict):
            return
        info, key = self._key(inductor_key, key_text)
        key_hash = key.hash
        REGISTRY.triton_stats.saved(str(key["op"]))
        sizes = _valid_sizes(info.get(SIZES_FIELD))
        meta: dict[str, Any] = {"sizes": sizes} if sizes else {}
        thread = threading.get_ident()
        # With coordinate descent on, autotune_to_one_config saves first (it passes the
        # winner's triton_cache_hash), then coordinate descent saves the final config
        # (without one). Hold the first: the second replaces it.
        first_of_two = (
            info.get("coordesc")
            and info.get("heuristic") not in (*NO_SAVE_HEURISTICS, "user_autotune")
            and value.get("triton_cache_hash") is not None
        )
        with self._lock:
            self._held.pop(key_hash, None)  # a second save replaces a held first one
        self.flush(thread)  # this thread has moved on from any other kernel it held
        if first_of_two:
            with self._lock:
                self._held[key_hash] = (thread, key, dict(value), meta)
            return
        self._publish(key, value, meta)

    def _publish(self, key: tc_keys.Key, value: Mapping[str, Any],
                 meta: Mapping[str, Any] | None = None) -> None:
        from tunecache import Result  # lazy: the core imports SQLAlchemy

        key_hash = key.hash
        entry = {k: v for k, v in value.items() if k != "time_taken_ms"}
        ms = tc_keys.to_ms(value.get("time_taken_ms", 0))
        timings = {tc_keys.canonical_json(entry): 0.0 if ms == math.inf else ms}
        if triton_config_from_entry(timings) is None:
            log.debug("tunecache: not publishing an unexpected Triton config %r", entry)
            REGISTRY.triton_stats.add(unpublished=1)
            return
        cache = self.cache()
        with self._lock:
            claim: Any = self._claims.pop(key_hash, None)  # taken by plan_coordesc
            noted = self._meta.pop(key_hash, None)
        if value.get("found_by_coordesc") and noted:
            meta = {**(meta or {}), **noted}
        planned = claim is not None
        if claim is None:
            claim = cache.claim(key, lease_seconds=TRITON_LEASE_SECONDS, wait=0.0)
        if claim is None or isinstance(claim, Result):
            # Done already (a peer published first, or this is a hit saved again), a
            # peer is publishing it right now, or the store is unavailable or readonly.
            REGISTRY.triton_stats.add(unpublished=1)
            return
        stored = cache.publish(claim, timings, tune_seconds=timings[next(iter(timings))] / 1000,
                               meta=meta or None)
        REGISTRY.triton_stats.add(**{"published" if stored is not None else "unpublished": 1})
        if planned and stored is None:
            with self._lock:
                self._unpublished.add(key_hash)

    def fusion_timing(self, key: Mapping[str, Any], *, waits: bool) -> tuple[str, Any]:
        """Where a fusion benchmark stands (:meth:`_claim_step`): ``("done", ms)``: decide
        on the stored timing, do not run it; ``("claimed", claim)``: run it here and
        :meth:`publish_fusion_ms`; ``"busy"`` or ``"local"``: see there."""
        return self._claim_step(key, waits, fusion_ms_from_entry)

    def publish_fusion_ms(self, key: Mapping[str, Any], claim: Any, ms: float) -> float:
        """Publish a fusion benchmark measured under ``claim``; return the timing every
        rank decides on: ``ms``, or the stored one where this process lost its claim
        (it stalled past the lease and a peer measured the module meanwhile)."""
        if self.cache().publish(claim, {"ms": ms}, tune_seconds=0.0) is not None:
            return ms
        answer = self.cache().lookup(key)
        stored = None if answer is None else fusion_ms_from_entry(answer.timings)
        return ms if stored is None else stored

    def stored_instead(self, inductor_key: str, key_text: str) -> dict[str, Any] | None:
        """After this process tuned a kernel under a claim it then failed to publish (it
        stalled past the lease and a peer took the key over): the stored config, which
        every other rank runs. None if the publish went through or nothing valid is stored.
        """
        _, key = self._key(inductor_key, key_text)
        key_hash = key.hash
        with self._lock:
            if key_hash not in self._unpublished:
                return None
            self._unpublished.discard(key_hash)
        answer = self.cache().lookup(key)
        return None if answer is None or answer.source == "failed" \
            else coordesc_result(answer.timings)


def _valid_sizes(sizes: Any) -> dict[str, int]:
    """A kernel's sizes as its key text carries them, or {} if they are not sizes."""
    if not isinstance(sizes, dict) or not sizes or len(sizes) > 8:
        return {}
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
               and v > 0 for k, v in sizes.items()):
        return {}
    return dict(sizes)


def describe_config(config: Any) -> str:
    """A stored config in a warning: a triton.Config's fields, or the stored text."""
    if hasattr(config, "kwargs"):
        text = (f"{dict(config.kwargs)} num_warps={getattr(config, 'num_warps', '?')} "
                f"num_stages={getattr(config, 'num_stages', '?')}")
    else:
        text = str(config)
    return text if len(text) <= 300 else text[:297] + "..."


@functools.cache
def remote_cache_class() -> type:
    """Our ``RemoteAutotuneCache``: Inductor's RemoteCache over a tunecache backend."""
    from torch._inductor import remote_cache as rc

    class TuneCacheAutotuneBackend(rc.RemoteCacheBackend):
        def __init__(self, cache_id: str) -> None:
            super().__init__()
            self.cache_id = cache_id

        def _get(self, key: str) -> Any:
            state = REGISTRY.triton
            return None if state is None else state.get(self.cache_id, key)

        def _put(self, key: str, data: Any) -> None:
            state = REGISTRY.triton
            if state is not None:
                state.put(self.cache_id, key, data)

    class TuneCacheAutotuneCache(rc.RemoteCache):
        """Inductor's remote autotune cache, backed by tunecache (tunecache.inductor)."""

        def __init__(self, cache_id: str) -> None:
            # Present wherever this class is used: install checks it first.
            super().__init__(TuneCacheAutotuneBackend(cache_id),
                             rc.RemoteCachePassthroughSerde())

    return TuneCacheAutotuneCache
