"""Transfer: a GEMM key nobody has tuned starts from the recorded keys of its structure
nearest in size, and benchmarks only the candidates that won there.

Family and size
    A GEMM key's family is the hash of everything in it but its sizes: the kind, op and
    environment (device, torch, triton, CUDA, Inductor flags), the float32 matmul
    precision, and for each input the device type, dtype, rank, the order of its strides
    and which of them are 0 or 1, and whether its offset is 0 (so a transposed operand or
    a broadcast batch is another family). Its sizes are the inputs' sizes, in Inductor's
    ``inputs_key`` order. Two keys of one family differ only in sizes; their distance is
    the sum over sizes of ``|log2 a - log2 b|``, and a key more than
    :data:`GEMM_MAX_OCTAVES` away in any one size is no neighbour (:func:`octaves`, which
    Triton kernels' transfer uses too, with its own bound).

What is transferred
    The candidate lists of the nearest neighbours (:data:`NEIGHBOURS`), each ranked by its
    stored timings: the :data:`FROM_NEAREST` fastest templates of the nearest, then the
    :data:`FROM_OTHERS` fastest of each of the others, at most :data:`MAX_TEMPLATES` in all.
    A template is matched by its identity without what depends on the shape
    (:func:`transfer_id`): a Triton template's name and config less ``EVEN_K`` and
    ``ALLOW_TF32``; a C++ template's category (it picks its blocking for the shape
    itself). Extern kernels (ATen) and candidates of kinds we cannot match are always
    benchmarked: they are the untuned baseline, and cheap.

Where it applies
    On a GPU, before generation (tunecache.inductor.narrow): templates not transferred are
    never generated, compiled or benchmarked. Everywhere, at the lookup: only the kept
    candidates are benchmarked, and the entry stores their timings, with ``meta
    ["transfer"]`` saying from which keys and how many of how many. Inductor gets ``inf``
    for the others in this compile. A later job finds the entry and narrows to it as to
    any stored entry, and does not top it up while transfer is on; with
    ``TUNECACHE_TRANSFER=0`` (and in ``tunecache warm --exhaustive``) a compile tops up the
    candidates the transfer left out under the usual ``extra_candidates`` key, which
    later jobs then merge.

Never wrong, at worst slower
    Transfer only picks among the candidates Inductor generated for this key. No
    neighbour, or no transferred template among this key's: tuned in full, as today. If
    every kept template fails to run, the key is tuned in full with one warning.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from .. import keys as tc_keys
from .. import measured

__all__ = ["GEMM_MAX_OCTAVES", "octaves", "NEIGHBOURS", "MAX_TEMPLATES", "DECISIVE_MARGIN",
           "Plan", "gemm_family", "gemm_sizes", "transfer_id", "winner_and_margin",
           "AGREE", "Agreement", "neighbours_agreement", "decisive_winner",
           "nearest_neighbours",
           "plan_transfer", "measure_by_plan", "baseline_meta"]

log = logging.getLogger("tunecache")

# A neighbour more than this many octaves away in any size is not one: its winners were
# chosen for another regime (tile counts, waves, split-K).
GEMM_MAX_OCTAVES = 3.0
NEIGHBOURS = 3
FROM_NEAREST = 4
FROM_OTHERS = 2
MAX_TEMPLATES = 6
# A winner this much faster than the runner-up in every neighbour (runner-up's time over
# the winner's, minus 1) is decisive: only it is generated (TUNECACHE_DECISIVE's "gemm"
# part). On GPUs every key whose neighbours agreed, at margins down to 0.07, had regret
# 1.000 (docs/benchmarks.md, 2026-12-05); a lower margin waits for more keys.
DECISIVE_MARGIN = 0.25
# Fields of a Triton template's config that follow from the shape, not the choice
# (mm_options, torch 2.11-2.14): K divisible by BLOCK_K, and TF32 allowed for it.
_SHAPE_FIELDS = re.compile(r"(?:^|, )(?:EVEN_K|ALLOW_TF32)=[^,]*")


def _parse_inputs(inputs: Any) -> list[tuple[Any, ...]] | None:
    """Inductor's ``inputs_key`` (a repr of ``[(device, dtype, *sizes, *strides,
    offset), ...]``, select_algorithm.key_of, 2.11-2.14) as tuples, or None."""
    if not isinstance(inputs, str) or len(inputs) > 8192:
        return None
    try:
        parsed = ast.literal_eval(inputs)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(parsed, (list, tuple)) or not parsed:
        return None
    out = []
    for item in parsed:
        if not isinstance(item, tuple) or len(item) < 3 or (len(item) - 3) % 2:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in item[2:]):
            return None
        out.append(item)
    return out


def _structure(item: tuple[Any, ...]) -> list[Any]:
    n = (len(item) - 3) // 2
    strides = item[2 + n: 2 + 2 * n]
    order = sorted(range(n), key=lambda d: (strides[d], d))
    return [str(item[0]), str(item[1]), n, order,
            [d for d in range(n) if strides[d] == 0],
            [d for d in range(n) if strides[d] == 1], item[-1] == 0]


def gemm_family(key: Mapping[str, Any]) -> str | None:
    """The family of a GEMM key (this module's docstring), or None if it has no sizes we
    can read (it then has no neighbours, and is never one)."""
    items = _parse_inputs(key.get("inputs"))
    if items is None or key.get("kind") != "gemm" or tc_keys.top_up_base(key) is not None:
        return None
    shape_free = {k: v for k, v in key.items() if k != "inputs"}
    shape_free["inputs"] = [_structure(item) for item in items]
    return hashlib.sha256(tc_keys.canonical_json(shape_free).encode()).hexdigest()


def gemm_sizes(key: Mapping[str, Any]) -> list[int] | None:
    items = _parse_inputs(key.get("inputs"))
    if items is None:
        return None
    return [v for item in items for v in item[2: 2 + (len(item) - 3) // 2]]


def octaves(a: Sequence[int], b: Sequence[int], bound: float) -> float | None:
    """The distance of two size lists in octaves (tunecache.keys.octaves_apart; a size
    below 1 counts as 1), or None where one size is more than ``bound`` octaves away.
    GEMM and Triton transfer both rank neighbours by it, each under its own bound."""
    return tc_keys.octaves_apart([max(x, 1) for x in a], [max(y, 1) for y in b],
                                 most_each=bound)


def transfer_id(candidate: str) -> str | None:
    """A candidate's identity across shapes, or None for one that is always benchmarked
    (extern kernels, and kinds we cannot match). ``#n`` suffixes (gemm.candidate_ids)
    stay: the n-th copy of a kernel is matched to the n-th."""
    base, sep, dup = candidate.partition("#")
    if base.startswith("triton:"):
        head, _, description = base.rpartition(":")
        shape_free = _SHAPE_FIELDS.sub("", description).lstrip(", ")
        return f"{head}:{shape_free}{sep}{dup}"
    if base.startswith("CppTemplateCaller:"):
        # "<category>-<hash of the generated source>": the category is the choice.
        return base.rsplit("-", 1)[0] + sep + dup
    return None


@dataclasses.dataclass(frozen=True)
class Plan:
    """What transfer keeps for one key: template identities (transfer_id) and the
    neighbours they came from; ``winner``, where the neighbours decide it
    (:func:`decisive_winner`), the one choice to generate: a template's transfer_id or
    an extern kernel's candidate id."""

    ids: frozenset[str]
    sources: tuple[str, ...]
    winner: str | None = None
    # The nearest neighbour's time for the winner: what a decided entry stores for it
    # (nothing is measured at the new size).
    winner_ms: float | None = None

    def keeps(self, candidate: str) -> bool:
        tid = transfer_id(candidate)
        return tid is None or tid in self.ids

    def meta(self, benchmarked: int, generated: int) -> dict[str, Any]:
        return {"transfer": {"from": list(self.sources), "benchmarked": benchmarked,
                             "generated": generated}}

    def applies(self, ids: Sequence[str]) -> bool:
        """Whether the plan may narrow a lookup of candidate ``ids`` (else it is tuned in
        full): always for neighbours; an upgrade's only where its old winner is one of
        them (upgrade.py)."""
        return True

    def decided_id(self, ids: Sequence[str]) -> str | None:
        """The one of a lookup's candidate ``ids`` this plan decides at the lookup itself,
        with nothing benchmarked, or None. A neighbour's decision is made before
        generation (narrow.py), never here; an upgrade's may be (upgrade.py)."""
        return None


def winner_and_margin(timings: Mapping[str, float]) -> tuple[str, float] | None:
    """A neighbour's winner as an identity across shapes, and its margin over the
    runner-up (runner-up's time over the winner's, minus 1; inf where nothing else ran);
    None where the winner is of a kind we cannot match, or the times are no measurements
    (:func:`tunecache.measured.all_measured`: a 0 or 1e-300 made any margin infinite)."""
    best = sorted((ms, c) for c, ms in timings.items() if math.isfinite(ms))
    if not best or not measured.all_measured(timings):
        return None
    ms, candidate = best[0]
    identity = transfer_id(candidate)
    if identity is None and candidate.startswith("extern:"):
        identity = candidate  # an ATen kernel's id names no size
    if identity is None:
        return None
    return identity, measured.margin(ms, best[1][0] if len(best) > 1 else None)


AGREE = "agree"


class Agreement(NamedTuple):
    """What a key's nearest neighbours say together. ``verdict`` is :data:`AGREE` where
    they all made one choice, else why they decide nothing; ``choice`` is that choice;
    ``margin`` the smallest of their margins, where they have one. Each part of
    ``TUNECACHE_DECISIVE`` decides where its neighbours agree (by its own margin), and
    tools/decisive_regret.py reads the same verdicts to cost those decisions."""

    verdict: str
    choice: Any = None
    margin: float | None = None

    def clear_by(self, threshold: float) -> bool:
        """Whether the neighbours agree and each picked the choice by at least
        ``threshold`` over its runner-up."""
        return self.verdict == AGREE and self.margin is not None and self.margin >= threshold


def neighbours_agreement(ranked: Sequence[Any]) -> Agreement:
    """Whether the nearest neighbours of a GEMM key (``ranked``: nearest first, at most
    :data:`NEIGHBOURS`, at least one) picked one choice, and their smallest margin. Only
    neighbours tuned in full count: a transferred entry timed a subset, so its runner-up
    may not be the real one."""
    if any("transfer" in n.meta for n in ranked):
        return Agreement("a neighbour was itself transferred")
    if not all(measured.all_measured(n.timings) for n in ranked):
        return Agreement("a neighbour's times are no measurements")
    winners = [w for n in ranked if (w := winner_and_margin(n.timings)) is not None]
    if len(winners) < len(ranked):
        return Agreement("a neighbour's winner is not matched across sizes")
    margin = min(m for _, m in winners)
    identities = {identity for identity, _ in winners}
    if len(identities) != 1:
        return Agreement("the neighbours disagree", margin=margin)
    return Agreement(AGREE, identities.pop(), margin)


def decisive_winner(ranked: Sequence[Any]) -> str | None:
    """The choice every one of the nearest neighbours (``ranked``) picked by at least
    :data:`DECISIVE_MARGIN` (:func:`neighbours_agreement`), or None."""
    if not ranked:
        return None
    agreement = neighbours_agreement(ranked)
    return str(agreement.choice) if agreement.clear_by(DECISIVE_MARGIN) else None


def nearest_neighbours(sizes: Sequence[int], neighbours: Sequence[Any]) -> list[Any]:
    """The :data:`NEIGHBOURS` nearest of a key's ``neighbours`` (entries of its family:
    ``key``, ``key_hash``, ``timings``, ``meta``) within :data:`GEMM_MAX_OCTAVES` of
    ``sizes``, nearest first; at the same distance entries tuned in full come first."""
    ranked = []
    for n in neighbours:
        their = gemm_sizes(n.key)
        d = None if their is None else octaves(sizes, their, GEMM_MAX_OCTAVES)
        if d is not None:
            ranked.append((d, "transfer" in n.meta, n.key_hash, n))
    ranked.sort(key=lambda r: r[:3])
    return [n for *_, n in ranked[:NEIGHBOURS]]


def plan_transfer(key: Mapping[str, Any], neighbours: Sequence[Any],
                  decisive: bool = False) -> Plan | None:
    """The plan for ``key`` from its family's recorded entries (``Neighbour`` objects),
    or None: no neighbour near enough, or none with a runnable template. ``decisive``:
    also name the winner where the nearest neighbours decide it."""
    sizes = gemm_sizes(key)
    family = gemm_family(key)
    if sizes is None or family is None:
        return None
    # A neighbour by its own key, not only by the family column its writer filled in.
    nearest = nearest_neighbours(sizes, [n for n in neighbours if gemm_family(n.key) == family])
    ids: list[str] = []
    sources = []
    for i, n in enumerate(nearest):
        take = FROM_NEAREST if i == 0 else FROM_OTHERS
        best = sorted((ms, c) for c, ms in n.timings.items() if math.isfinite(ms))
        templates = [tid for _, c in best if (tid := transfer_id(c)) is not None]
        new = [t for t in templates[:take] if t not in ids][: MAX_TEMPLATES - len(ids)]
        if new:
            ids += new
            sources.append(n.key_hash)
    if not ids:
        return None
    winner = decisive_winner(nearest) if decisive else None
    winner_ms = None if winner is None else min(
        ms for ms in nearest[0].timings.values() if math.isfinite(ms))
    return Plan(frozenset(ids), tuple(sources), winner, winner_ms)


def measure_by_plan(
    plan: Plan | None,
    choices: list[Any],
    ids: Sequence[str],
    failed: Sequence[str],
    bench: Callable[[list[Any]], dict[str, float]],
    op: str,
) -> tuple[dict[str, float], int | None]:
    """The timings of a lookup's ``choices`` (``ids``: their candidate ids) by
    ``bench``, ``inf`` for the ``failed`` ones, and how many were benchmarked by the
    plan (None: tuned in full). Only the choices ``plan`` keeps are benchmarked where it
    keeps a template of this compile; all of them where it keeps none, or where no kept
    template ran (one warning). None where the plan decides the lookup
    (:meth:`Plan.decided_id`): its one choice with the plan's time, 0 benchmarked."""
    if plan is not None and not plan.applies(ids):
        plan = None
    decided = None if plan is None else plan.decided_id(ids)
    if decided is not None and decided not in failed and plan is not None \
            and plan.winner_ms is not None:
        return {decided: plan.winner_ms}, 0
    kept = [c for c, i in zip(choices, ids) if plan is not None and plan.keeps(i)]
    matched = plan is not None and any(
        transfer_id(i) is not None for c, i in zip(choices, ids) if plan.keeps(i))
    subset = kept if matched else choices
    measured = {**bench(subset), **{i: math.inf for i in failed}}
    if matched and len(subset) < len(choices):
        in_subset = {id(c) for c in subset}
        kept_templates = [i for c, i in zip(choices, ids)
                          if id(c) in in_subset and transfer_id(i) is not None]
        if not any(math.isfinite(measured[i]) for i in kept_templates):
            log.warning("tunecache: no transferred candidate of this %s ran; tuning "
                        "it in full", op)
            rest = [c for c in choices if id(c) not in in_subset]
            measured.update(bench(rest))
            matched = False
    return measured, len(subset) if matched else None


def baseline_meta(timings: Mapping[str, float]) -> dict[str, Any]:
    """What tuning bought: the fastest extern kernel's time (the choice Inductor makes
    without max-autotune) and the winner's."""
    externs = sorted((ms, c) for c, ms in timings.items()
                     if c.startswith("extern:") and math.isfinite(ms))
    finite = [ms for ms in timings.values() if math.isfinite(ms)]
    meta: dict[str, Any] = {}
    if externs:
        meta["baseline"] = {"candidate": externs[0][1], "ms": externs[0][0]}
    if finite:
        meta["best_ms"] = min(finite)
    return meta
