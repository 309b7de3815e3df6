"""Epilogue-fusion decisions, shared across sizes and graphs.

Under max-autotune Inductor decides whether to fuse a pointwise or reduction epilogue into
a GEMM template by generating, compiling and timing candidate modules: the epilogue alone
and the template with the epilogue fused (``Scheduler.speedup_by_fusion``). It fuses when
the fused kernel beats the best unfused GEMM plus the epilogue. The timings are shared
already (:mod:`.fusion`), but they are keyed by the generated source, so a new token count
or a changed graph generates and compiles every candidate again.

A decision is keyed by its *site* (:mod:`.sites`): the GEMM's structure (its inputs'
dtypes and stride orders) and the epilogue's structure (each node's kind, reduction, ops,
dtypes and read patterns) without sizes, plus the GEMM's sizes. Its entry holds the
timings Inductor decided on (``unfused``: the best unfused GEMM plus the epilogue alone;
``fused``: the best fused candidate; ``runner_up``: the next fused candidate, when more
than one was timed) and, for a fusion, which candidate won: its rank among the GEMM's
Triton choices ordered by their unfused time (``meta["rank"]``; 0, the fastest, under
Inductor's default ``max_epilogue_benchmarked_choices = 1``). A decision to fuse is
``fused < unfused``, Inductor's own rule, so an entry cannot say otherwise.

Every rank follows the site's entry (:func:`settle`): the first to decide publishes, the
others adopt what it published, so two ranks never fuse differently. With the ``fusion``
part of ``TUNECACHE_DECISIVE`` a site with no entry is decided by its neighbours (the same
site at other sizes, :func:`neighbours_decide`) where the nearest ones all decided alike,
each by a clear margin: nothing is generated, compiled or timed for it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ... import keys as tc_keys
from ... import measured
from ...core.cache import TuneCache
from ...core.result import Result
from ..transfer import AGREE, GEMM_MAX_OCTAVES, Agreement, octaves

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...store import Claim

__all__ = ["DECISION_KIND", "DECIDING_SITES", "FUSION_DECISIVE_MARGIN", "Decision",
           "decision_key", "neighbours_decide", "nearest_sites", "sites_agreement",
           "stored_decision",
           "decided_by_neighbours", "settle", "family_of", "replace"]

DECISION_KIND = "fusion_decision"
# How many of the nearest recorded sites must agree for a decision without measuring.
DECIDING_SITES = 3
# How clearly each of them must have decided (the slower option's time over the faster
# one's, minus 1). On GPUs every site decided so had regret 1.000 (docs/benchmarks.md,
# 2026-12-05), but none was a close call: this margin is not yet tested.
FUSION_DECISIVE_MARGIN = 0.10
# A peer holds a site's claim only while it publishes the decision it has made.
SETTLE_WAIT_SECONDS = 10.0
_MAX_RANK = 64
_MAX_SIZES = 16
_TIMINGS = frozenset({"unfused", "fused", "runner_up"})


@dataclasses.dataclass(frozen=True)
class Decision:
    """One epilogue-fusion decision: the timings it was made on, and ``rank``: which
    fused candidate won (see the module's docstring), None when it did not fuse."""

    unfused_ms: float
    fused_ms: float
    runner_up_ms: float | None = None
    rank: int | None = None

    @classmethod
    def of(cls, unfused_ms: float, fused_ms: Sequence[float], rank: int | None) -> Decision:
        """The decision Inductor made on these timings (``fused_ms``: every fused
        candidate's) and, for a fusion, its winner's ``rank``."""
        ordered = sorted(fused_ms)
        fused = ordered[0] < unfused_ms
        return cls(unfused_ms, ordered[0], ordered[1] if len(ordered) > 1 else None,
                   rank if fused else None)

    @property
    def fused(self) -> bool:
        return self.rank is not None

    def margin(self) -> float:
        """How clearly it was decided: the slower option over the faster, minus 1; for a
        fusion also the winner over the next fused candidate."""
        low, high = sorted((self.unfused_ms, self.fused_ms))
        margin = measured.margin(low, high)
        if self.fused and self.runner_up_ms is not None:
            margin = min(margin, measured.margin(self.fused_ms, self.runner_up_ms))
        return margin

    def measured(self) -> bool:
        """Whether its times are measurements (tunecache.measured), so that it may
        decide for another site."""
        return measured.all_measured(self.timings())

    def applies(self, choices: int) -> bool:
        """Whether it can be followed at a site whose template has ``choices`` Triton
        choices: not to fuse, or to fuse one of them."""
        return not self.fused or measured.within(self.rank, choices)

    def timings(self) -> dict[str, float]:
        out = {"unfused": self.unfused_ms, "fused": self.fused_ms}
        if self.runner_up_ms is not None:
            out["runner_up"] = self.runner_up_ms
        return out

    def meta(self, sizes: Sequence[int]) -> dict[str, Any]:
        return {"sizes": list(sizes), **({"rank": self.rank} if self.fused else {})}

    @classmethod
    def from_entry(cls, timings: Mapping[str, float], meta: Mapping[str, Any]
                   ) -> Decision | None:
        """The decision of a stored entry (timings validated by the cache: finite or
        inf, >= 0), or None where it is not one this module writes."""
        if not {"unfused", "fused"} <= set(timings) <= _TIMINGS:
            return None
        unfused, fused = timings["unfused"], timings["fused"]
        rank = meta.get("rank")
        if fused < unfused:
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < _MAX_RANK:
                return None
        elif rank is not None:
            return None
        return cls(unfused, fused, timings.get("runner_up"), rank)


def decision_key(env: Mapping[str, str], structure: Any, sizes: Sequence[int]
                 ) -> tc_keys.Key:
    """The key of a site's decision; its family is the key without ``sizes``."""
    shape_free = {"kind": DECISION_KIND, "op": "epilogue_fusion", "env": dict(env),
                  "site": structure}
    family = hashlib.sha256(tc_keys.canonical_json(shape_free).encode()).hexdigest()
    return tc_keys.Key.of({**shape_free, "sizes": list(sizes)}, family=family)


def family_of(mapping: Mapping[str, Any]) -> tuple[str, list[int]] | None:
    """The family and sizes a recorded key says it has (:func:`decision_key`), or None
    where it is no decision key: a neighbour is one by its own key, not only by the
    family column its writer filled in."""
    if mapping.get("kind") != DECISION_KIND or set(mapping) != {
            "kind", "op", "env", "site", "sizes"}:
        return None
    sizes = _sizes(mapping["sizes"])
    if sizes is None:
        return None
    shape_free = {k: v for k, v in mapping.items() if k != "sizes"}
    try:
        text = tc_keys.canonical_json(shape_free)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest(), sizes


def _sizes(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not 0 < len(value) <= _MAX_SIZES:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        return None
    return value


def neighbours_decide(sizes: Sequence[int],
                      found: Sequence[tuple[str, Decision, Mapping[str, Any]]]
                      ) -> tuple[Decision, list[str]] | None:
    """Where the :data:`DECIDING_SITES` nearest recorded sites (``found``: key hash,
    decision, meta), all measured (none decided by its own neighbours), all decided the
    same way by at least :data:`FUSION_DECISIVE_MARGIN`: the nearest one's decision and
    the key hashes it rests on; else None."""
    nearest = nearest_sites(sizes, found)
    if not nearest:
        return None
    agreement = sites_agreement(nearest)
    if not agreement.clear_by(FUSION_DECISIVE_MARGIN):
        return None
    return agreement.choice, [key_hash for key_hash, _, _ in nearest]


def sites_agreement(nearest: Sequence[tuple[str, Decision, Mapping[str, Any]]]
                    ) -> Agreement:
    """Whether the nearest recorded sites (key hash, decision, meta; at least one), all
    measured (none decided by its own neighbours), decided alike: the nearest one's
    decision, and the smallest of their margins."""
    if any("transfer" in meta for _, _, meta in nearest):
        return Agreement("a neighbour was itself decided")
    if not all(decision.measured() for _, decision, _ in nearest):
        return Agreement("a neighbour's times are no measurements")
    margin = min(decision.margin() for _, decision, _ in nearest)
    if len({decision.rank for _, decision, _ in nearest}) != 1:
        return Agreement("the neighbours disagree", margin=margin)
    return Agreement(AGREE, nearest[0][1], margin)


def nearest_sites(sizes: Sequence[int],
                  found: Sequence[tuple[str, Decision, Mapping[str, Any]]]
                  ) -> list[tuple[str, Decision, Mapping[str, Any]]]:
    """The :data:`DECIDING_SITES` of ``found`` (key hash, decision, meta) nearest to
    ``sizes``, within :data:`GEMM_MAX_OCTAVES` in every size, nearest first."""
    ranked = []
    for key_hash, decision, meta in found:
        theirs = _sizes(meta.get("sizes"))
        distance = None if theirs is None else octaves(sizes, theirs, GEMM_MAX_OCTAVES)
        if distance is not None:
            ranked.append((distance, key_hash, decision, meta))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [(key_hash, decision, meta) for _, key_hash, decision, meta in
            ranked[:DECIDING_SITES]]


def _from_result(result: Result) -> Decision | None:
    if result.source == "failed":
        return None
    return Decision.from_entry(result.timings, result.meta)


def stored_decision(cache: TuneCache, key: tc_keys.Key) -> Decision | None:
    """The site's stored decision; a plain read."""
    answer = cache.lookup(key)
    return None if answer is None else _from_result(answer)


def decided_by_neighbours(cache: TuneCache, key: tc_keys.Key, sizes: Sequence[int],
                          choices: int | None = None) -> Decision | None:
    """With no entry for the site: the decision its neighbours make
    (:func:`neighbours_decide`), published as the site's entry under a claim taken
    without waiting, so that every rank follows it; None where they do not decide, or
    a peer holds the site's claim (this process then measures, and :func:`settle`
    follows whatever was published). A neighbour counts only where its own key is of
    this site's family and, with ``choices`` (the site's Triton choices), it decided
    something this site can follow."""
    found = []
    for n in cache.neighbours(key):
        decision = Decision.from_entry(n.timings, n.meta)
        of = family_of(n.key)
        if decision is None or of is None or of[0] != key.family:
            continue
        if choices is not None and not decision.applies(choices):
            continue
        # Its sizes as its key says, whatever its meta says.
        found.append((n.key_hash, decision, {**n.meta, "sizes": of[1]}))
    decided = neighbours_decide(sizes, found)
    if decided is None:
        return None
    decision, sources = decided
    claim = cache.claim(key, wait=0.0)
    if isinstance(claim, Result):
        return _from_result(claim)
    if claim is None:
        return None
    meta = {**decision.meta(sizes), "transfer": {"from": sources, "benchmarked": 0}}
    try:
        published = cache.publish(claim, decision.timings(), tune_seconds=0.0, meta=meta)
    except BaseException as e:
        cache.release(claim, f"publishing a fusion decision failed: {e!r}", failed=False)
        raise
    if published is None:  # the claim was lost: a peer's entry, if it is in
        return stored_decision(cache, key)
    return decision


def settle(cache: TuneCache, key: tc_keys.Key, ours: Decision, sizes: Sequence[int]
           ) -> Decision:
    """The decision every rank makes at this site: the stored one if a peer published
    first, else ``ours``, published now. A peer publishing right now is waited for
    (:data:`SETTLE_WAIT_SECONDS`); with no store to agree through, ``ours``."""
    claim = cache.claim(key, wait=SETTLE_WAIT_SECONDS)
    if isinstance(claim, Result):
        return _from_result(claim) or ours
    if claim is None:
        return ours
    if _publish(cache, claim, ours, sizes) is None:
        return stored_decision(cache, key) or ours
    return ours


def _publish(cache: TuneCache, claim: Claim, ours: Decision, sizes: Sequence[int]
             ) -> Result | None:
    """Publish ``ours`` under ``claim``; the claim is released where that raises."""
    try:
        return cache.publish(claim, ours.timings(), tune_seconds=0.0, meta=ours.meta(sizes))
    except BaseException as e:
        cache.release(claim, f"publishing a fusion decision failed: {e!r}", failed=False)
        raise


def replace(cache: TuneCache, key: tc_keys.Key, found: Decision, ours: Decision,
            sizes: Sequence[int]) -> Decision | None:
    """``ours``, measured here, published in place of the site's entry ``found``, which
    no process can follow (a rank outside the template's choices): left alone, every
    job warned about it and kept its own, for good. The entry a peer replaced it with
    meanwhile, or None where it cannot be replaced."""
    stored = cache.lookup(key)
    if stored is None or _from_result(stored) != found:
        return None
    claim = cache.reclaim(key, stored)
    if isinstance(claim, Result):
        return _from_result(claim)
    if claim is None:
        return None
    published = _publish(cache, claim, ours, sizes)
    return ours if published is not None else stored_decision(cache, key)
