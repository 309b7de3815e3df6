"""``Scheduler.speedup_by_fusion`` through shared epilogue-fusion decisions
(:mod:`.decisions`), torch 2.11-2.14.

With ``TUNECACHE_DECISIVE``'s ``fusion`` part, where the site of a GEMM-template
epilogue fusion (:mod:`.sites`) has a decision stored, or its neighbours decide it, the
decision is replayed: nothing is generated, compiled or timed. It is returned as a
pending decision, like Inductor's benchmarked ones, so the scheduler evaluates it at the
same point; a fusion then finalizes the template as the decided candidate, as Inductor
does after its benchmarks. The candidate's code is generated once first, with this
epilogue: one that does not generate (its tiling cannot take the epilogue), or a rank the
GEMM has no candidate for, leaves the site to Inductor's benchmarks.

Elsewhere Inductor decides as always, and its decision is published as the site's entry;
where a peer published first, Inductor's own decision is replaced by the peer's, so every
rank fuses alike. The timings come from the fusion benchmarks themselves (:mod:`.fusion`
notes each one in the thread's ``decision`` list).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..compat import param_names
from ..state import REGISTRY
from . import decisions
from .decisions import Decision
from .sites import FusionSite, fusion_site

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...patching import Ledger

__all__ = ["install_decision_replay"]

log = logging.getLogger("tunecache")


def _ranked_choices(template: Any) -> list[Any]:
    """The template's Triton choices, fastest unfused first: the order in which Inductor
    fuses them into candidates."""
    from torch._inductor.select_algorithm import TritonTemplateCaller

    timings = template.choice_timings()
    return [c for c, _ in sorted(timings.items(), key=lambda item: item[1])
            if isinstance(c, TritonTemplateCaller)]


def _generates(scheduler: Any, site: FusionSite, choice: Any) -> bool:
    """Whether the template as ``choice`` generates code with the epilogue fused (a
    tiling that cannot take the epilogue raises here, as in Inductor's own candidates)."""
    try:
        with site.template.swap_as_triton_caller(choice):
            scheduler.generate_kernel_code_from_nodes(site.fused, benchmark_kernel=True)
    except Exception as e:  # noqa: BLE001 - Inductor's benchmarks decide instead
        log.debug("tunecache: a decided fusion candidate does not generate: %r", e)
        return False
    return True


def _fusing_choice(scheduler: Any, site: FusionSite, decision: Decision) -> Any | None:
    """The choice a fusion decision names here, if it generates; else None."""
    assert decision.rank is not None
    ranked = _ranked_choices(site.template)
    if decision.rank >= len(ranked):
        return None
    choice = ranked[decision.rank]
    return choice if _generates(scheduler, site, choice) else None


def _replay(scheduler: Any, site: FusionSite, decision: Decision
            ) -> Callable[[], bool] | None:
    """``decision`` at ``site`` as the scheduler's pending decision (evaluated where
    Inductor evaluates its benchmarked ones, and only if the fusion is still possible
    then), or None if it cannot be applied here."""
    if not decision.fused:
        return lambda: False
    choice = _fusing_choice(scheduler, site, decision)
    if choice is None:
        return None

    def fuse() -> bool:
        site.template.finalize_as_triton_caller(choice)
        return True

    return fuse


def _agreeing(scheduler: Any, site: FusionSite, epilogue_ms: float,
              decide: Callable[[], bool]) -> Callable[[], bool]:
    """Inductor's benchmarking ``decide``, then the site's shared decision: ours,
    published, or a peer's, which replaces ours."""

    def decide_and_agree() -> bool:
        state = REGISTRY.triton
        template = site.template
        before = None
        if state is not None:
            with state.attempt("reading a fusion site's choices"):
                _, best_unfused = template.get_min_choice()
                before = _Before(_ranked_choices(template), best_unfused,
                                 template.make_kernel_render, dict(template._choice_timings))
        local = REGISTRY.fusion_local
        outer = getattr(local, "decision", None)
        fused_ms: list[float] = []  # .fusion notes each candidate's timing here
        local.decision = fused_ms
        try:
            fused = decide()
        finally:
            local.decision = outer
        if state is None or before is None or not fused_ms:
            return fused
        agreed = fused  # also where sharing fails: Inductor's own decision stands
        with state.attempt("sharing a fusion decision"):
            agreed = _agree(scheduler, site, state, before, epilogue_ms, fused_ms, fused)
        return agreed

    return decide_and_agree


class _Before(NamedTuple):
    """A fusion site's template as Inductor left it before its benchmarks: its Triton
    choices by unfused time, the best unfused time, and what a fusion changes."""

    ranked: list[Any]
    best_unfused: float
    render: Any
    choice_timings: dict[Any, Any]


def _agree(scheduler: Any, site: FusionSite, state: Any, before: _Before,
           epilogue_ms: float, fused_ms: list[float], fused: bool) -> bool:
    """Publish the decision Inductor made, or adopt the one a peer published first."""
    ranked = before.ranked
    template = site.template
    rank = None
    if fused:
        timings: dict[Any, float] = template._choice_timings.get(None) or {}
        winner = min(timings, key=lambda c: timings[c]) if timings else None
        if winner not in ranked:
            return fused
        rank = ranked.index(winner)
    ours = Decision.of(before.best_unfused + epilogue_ms, fused_ms, rank)
    agreed = decisions.settle(state.cache(), site.key, ours, site.sizes)
    if not agreed.applies(len(ranked)):
        # No process can follow it (a planted rank): ours, measured, replaces it.
        agreed = decisions.replace(state.cache(), site.key, agreed, ours, site.sizes) \
            or agreed
    if agreed.rank == ours.rank:
        return fused
    choice = _fusing_choice(scheduler, site, agreed) if agreed.fused else None
    if agreed.fused and choice is None:
        log.warning("tunecache: a peer's fusion decision does not apply in this process; "
                    "it keeps its own")
        return fused
    template.make_kernel_render, template._choice_timings = before.render, before.choice_timings
    REGISTRY.triton_stats.add(fusion_decisions_adopted=1)
    if choice is None:
        return False
    template.finalize_as_triton_caller(choice)
    return True


def _sharing_speedup_by_fusion(orig: Callable[..., Any]) -> Callable[..., Any]:
    def speedup_by_fusion(self: Any, node1: Any, node2: Any) -> Any:
        state = REGISTRY.triton
        if state is None:
            return orig(self, node1, node2)
        site = stored = None
        with state.attempt("reading a fusion decision"):
            site = fusion_site(self, node1, node2)
            if site is not None:
                cache = state.cache()
                replays = "fusion" in cache.settings.levers.decisive
                if replays:
                    stored = decisions.stored_decision(cache, site.key)
                if stored is None and cache.settings.shares("transfer") and replays:
                    stored = decisions.decided_by_neighbours(
                        cache, site.key, site.sizes, len(_ranked_choices(site.template)))
                    if stored is not None:
                        REGISTRY.triton_stats.add(fusion_decisions_decided=1)
        if site is None:
            return orig(self, node1, node2)
        from torch._inductor.scheduler import FusionResult

        if stored is not None:
            replayed = None
            with state.attempt("replaying a fusion decision"):
                replayed = _replay(self, site, stored)
            if replayed is not None:
                REGISTRY.triton_stats.add(fusion_decisions_replayed=1)
                return FusionResult.from_callable(replayed)
        local = REGISTRY.fusion_local
        outer = getattr(local, "decision", None)
        epilogue_ms: list[float] = []  # Inductor times the epilogue alone here
        local.decision = epilogue_ms
        try:
            result = orig(self, node1, node2)
        finally:
            local.decision = outer
        if result.callable_fn is None or len(epilogue_ms) != 1:
            return result  # decided without benchmarks: nothing to share
        return FusionResult.from_callable(
            _agreeing(self, site, epilogue_ms[0], result.callable_fn), result.future)

    return speedup_by_fusion


def install_decision_replay(patches: Ledger) -> None:
    """Wrap Scheduler.speedup_by_fusion, through ``patches``."""
    from torch._inductor import ir
    from torch._inductor.scheduler import FusionResult, Scheduler

    orig = Scheduler.__dict__.get("speedup_by_fusion")
    if not callable(orig) or param_names(orig)[:2] != ("node1", "node2"):
        raise TypeError("Scheduler.speedup_by_fusion(node1, node2) changed")
    for name in ("_any_atomic_add", "_has_layout_conflict_for_template",
                 "generate_kernel_code_from_nodes"):
        if not callable(getattr(Scheduler, name, None)):
            raise TypeError(f"Scheduler.{name} is gone")
    for name in ("swap_as_triton_caller", "finalize_as_triton_caller", "get_min_choice",
                 "choice_timings"):
        if not callable(getattr(ir.MultiTemplateBuffer, name, None)):
            raise TypeError(f"MultiTemplateBuffer.{name} is gone")
    if not callable(getattr(FusionResult, "from_callable", None)):
        raise TypeError("FusionResult.from_callable is gone")
    patches.patch(Scheduler, "speedup_by_fusion", _sharing_speedup_by_fusion(orig))
