"""A GEMM whose key is a stored hit generates only the Triton template choices that can
win, not all of them.

Where
    Inductor's GEMM lowerings (``tuned_mm``, ``tuned_bmm``, ``tuned_addmm`` ...) get their
    candidates from ``V.choices.get_template_configs(kernel_inputs, templates, op_name,
    kwarg_overrides)``, which builds cheap ``KernelTemplateChoice`` objects (a template
    and its config), passes them through ``_finalize_template_configs`` ("override this
    to customize the choices before they are converted to ChoiceCaller objects, which is
    expensive") and only then generates each one (``ktc.choice``: for a Triton template,
    rendering and loading its module, ``generate_and_load``; ~840 of them, 4-9 s, in a
    warm job). We wrap both methods on ``InductorChoices`` itself (2.11-2.14), so
    every choices handler that inherits them, Inductor's default included, is covered;
    :func:`tunecache.inductor.disable` puts them back (the registry's patch ledger).

What is kept
    The key is :func:`.gemm.make_key` of (``op_name``, ``create_inputs_key(nodes)``,
    ``hint_override=None``), exactly what the selector's ``lookup`` builds for the
    ``autotune_select_algorithm(op_name, choices, kernel_inputs.nodes(), ...)`` call that
    follows; when it is not stored (a plain read: no claim, no wait) nothing changes. On a
    hit, every choice stays except Triton templates: extern kernels (ATen; cheap, and the
    fallback Inductor's selection may prefer, ``min_speedup_threshold``), templates whose
    identity we cannot tell before generating them, and anything a lowering adds outside
    this call (C++, CUTLASS, CK). Of the Triton templates, the ``n`` fastest by their
    stored timings stay, ``n = max(1, config.max_epilogue_benchmarked_choices)``, and at
    least 2 where the call has no extern kernel. A template's identity (candidate_id: the
    template name and the description ``generate_and_load`` writes, its sorted meta kwargs
    then ``num_stages``, ``num_warps`` and, where Triton has warp specialization, its two
    fields) is computed from the config before generation. Narrowing needs every template
    of the call to be in the stored entry (or in its ``extra_candidates`` top-up entry);
    a template nobody timed means a benchmark, so then everything is generated as before.

Why these, and the trade-off
    All ranks keep the same choices: they read the one stored entry. The selector then
    runs as usual on the kept list, its timings all from the database (no benchmark, no
    precompile: the probe in ``make_precompile_fn`` is a full hit), so it picks what the
    tuning job picked: the winner is kept, and so is every extern kernel. Keeping at least
    two choices matters: with one, ``AlgorithmSelectorCache.__call__`` returns it at once,
    without a ``MultiTemplateBuffer``, so the epilogue-fusion benchmark that the tuning
    job ran on the deferred path would not run, and the scheduler would fuse
    unconditionally. With the ``n`` fastest templates kept, ``speedup_by_fusion`` sees the
    same fastest choices in the same order, the same ``ms1`` and, through
    triton/candidates.py and triton/fusion.py, the same fused timings, so it decides as
    the tuning job did. What is given up: paths that go further down the list than
    ``max_epilogue_benchmarked_choices`` (the atomic-add epilogue path tries templates in
    order until one compiles; a kept template that fails to compile there falls back to
    not fusing instead of trying the next) and ``config.multi_kernel_hints`` (not narrowed
    at all). Triton templates that fail generation (``choice_or_none`` returns None) are
    never in an entry, so a call that has one is never narrowed.

Safety net
    After generation, the kept templates' actual identities are checked against the
    predicted ones; a mismatch (a torch whose description format differs) logs one
    warning, generates the call again in full, and turns narrowing off for the process.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import keys as tc_keys
from ..parts import Part
from .compat import InductorChanged, inductor_config, param_names, require
from .gemm import candidate_id, gemm_key
from .state import REGISTRY
from .transfer import Plan, transfer_id

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..opener import CacheOpener
    from ..patching import Ledger
    from ..settings import Settings
    from .entries import GemmEntries

__all__ = ["NARROWING", "install_narrowing", "predicted_id", "decided_narrow"]

log = logging.getLogger("tunecache")


@functools.cache
def _generate_params(generate: Any) -> frozenset[str] | None:
    """Named parameters of a template class's ``generate`` (what does not end up in the
    meta kwargs)."""
    try:
        params = inspect.signature(generate).parameters.values()
    except (TypeError, ValueError):
        return None
    return frozenset(p.name for p in params if p.kind is not p.VAR_KEYWORD)


def predicted_id(ktc: Any) -> str | None:
    """The candidate_id the choice of this KernelTemplateChoice will have, or None if we
    cannot tell before generating it (only plain TritonTemplates are predicted)."""
    from torch._inductor import select_algorithm as sa

    template = getattr(ktc, "template", None)
    if template is None or type(template) is not sa.TritonTemplate:
        return None
    named = _generate_params(type(template).generate)
    if named is None or "num_stages" not in named or "num_warps" not in named:
        return None
    kwargs = {**ktc.params.to_kwargs(), **ktc.extra_kwargs}
    if "num_stages" not in kwargs or "num_warps" not in kwargs:
        return None
    meta = {k: v for k, v in kwargs.items() if k not in named}
    import torch

    if torch.cuda.is_available():
        # TritonTemplate.generate's TF32 workaround, before the description is made
        supported = getattr(torch.cuda, "is_tf32_supported", None)
        if supported is None:
            return None
        if not supported():
            meta["ALLOW_TF32"] = "False"
    parts = [f"{k}={meta[k]!r}" for k in sorted(meta)]
    parts += [f"num_stages={kwargs['num_stages']}", f"num_warps={kwargs['num_warps']}"]
    if getattr(sa, "HAS_WARP_SPEC", False):
        parts += [f"num_consumer_groups={kwargs.get('num_consumer_groups', 0)}",
                  f"num_buffers_warp_spec={kwargs.get('num_buffers_warp_spec', 0)}"]
    description = ("-".join(parts) + "-").strip("-").replace("-", ", ")
    return f"triton:triton_{template.name}:{description}"


def _keep_count(has_extern: bool) -> int:
    n = max(1, int(inductor_config("max_template_fusion_benchmarked_choices",
                                   "max_epilogue_benchmarked_choices", 1) or 1))
    return n if has_extern else max(2, n)


def narrow(ktcs: list[Any],
           stored: Callable[[list[str]], tuple[dict[str, float], bool] | None],
           ) -> tuple[tuple[list[Any], list[str]] | None, int]:
    """(plan, templates): the plan is the choices to generate and the predicted ids of
    the kept templates, or None to generate all; templates: how many choices were
    predictable templates. ``stored(template ids)``: the stored timings covering those
    ids and whether they are a transferred entry's (which covers only the templates the
    transfer kept: the others are not generated), or None."""
    predicted = [(i, ktc, predicted_id(ktc)) for i, ktc in enumerate(ktcs)]
    templates = [(i, pid) for i, _, pid in predicted if pid is not None]
    if len(templates) < 2:
        return None, len(templates)  # nothing to save
    found = stored([pid for _, pid in templates])
    if found is None:
        return None, len(templates)
    timings, transferred = found
    if transferred:
        templates = [(i, pid) for i, pid in templates if pid in timings]
        if not templates:
            return None, len(templates)
    elif any(pid not in timings for _, pid in templates):
        return None, len(templates)
    from torch._inductor.select_algorithm import ExternKernelChoice

    has_extern = any(isinstance(k.template, ExternKernelChoice) for k in ktcs)
    # Ties keep list order, as Inductor's min() over its timings does.
    ranked = sorted(templates, key=lambda t: (timings[t[1]], t[0]))
    keep = ranked[: _keep_count(has_extern)]
    if not has_extern and not any(math.isfinite(timings[pid]) for _, pid in keep):
        return None, len(templates)  # nothing runnable stored: Inductor sees them all
    kept = {i for i, _ in keep}
    return ([k for i, k, pid in predicted if pid is None or i in kept],
            [pid for _, pid in keep]), len(templates)


def transfer_narrow(ktcs: list[Any], plan: Plan) -> tuple[list[Any], list[str]] | None:
    """The choices to generate for a key with no entry, by its transfer plan: every
    choice but the predictable templates the plan does not keep; None (generate all)
    where none of the predictable templates is kept or nothing would be left out."""
    predicted = [(ktc, predicted_id(ktc)) for ktc in ktcs]
    kept = [(ktc, pid) for ktc, pid in predicted if pid is None or plan.keeps(pid)]
    expected = [pid for _, pid in kept if pid is not None]
    if not expected or len(kept) == len(ktcs):
        return None
    return [ktc for ktc, _ in kept], expected


def decided_narrow(ktcs: list[Any], plan: Plan) -> tuple[list[Any], list[str]] | None:
    """The one choice to generate for a key with no entry whose neighbours decided it
    (``plan.winner``), or None (follow the plan's templates): the template whose
    identity across shapes is the winner's, or, where the winner is an ATen kernel, the
    call's only extern choice. One choice is returned by ``AlgorithmSelectorCache``
    at once: no benchmark, no lookup, no epilogue-fusion benchmark (the scheduler fuses
    as it does for a single template)."""
    from torch._inductor.select_algorithm import ExternKernelChoice

    winner = plan.winner
    if winner is None:
        return None
    if winner.startswith("extern:"):
        # Two extern kernels (mm and a bias addmm) would be benchmarked and their entry
        # stored without templates, which a later job would top up in full.
        externs = [k for k in ktcs if isinstance(k.template, ExternKernelChoice)]
        if len(externs) != 1:
            return None
        # Only this call's own kernel is a decision: neighbours naming another
        # ("extern:evil") published it as the key's entry, which no job could use.
        # Generating an extern choice is cheap, and Inductor keeps it (ktc.choice).
        choice = externs[0].choice
        return (externs, []) if choice is not None and candidate_id(choice) == winner \
            else None
    found = [(ktc, pid) for ktc in ktcs
             if (pid := predicted_id(ktc)) is not None and transfer_id(pid) == winner]
    if len(found) != 1:
        return None
    return [found[0][0]], [found[0][1]]


def _gemm_key(op_name: str, kernel_inputs: Any) -> tc_keys.Key:
    """The key the selector's lookup will build for this call (gemm.py)."""
    from torch._inductor.select_algorithm import create_inputs_key

    inputs = create_inputs_key(kernel_inputs.nodes())
    return gemm_key(op_name, inputs, None, _device_type(kernel_inputs, inputs))


def _stored_for(entries: GemmEntries, key: tc_keys.Key,
                ) -> Callable[[list[str]], tuple[dict[str, float], bool] | None]:
    def stored(ids: list[str]) -> tuple[dict[str, float], bool] | None:
        timings = entries.stored(key)
        if timings is None:
            return None
        missing = sorted(i for i in ids if i not in timings)
        if missing:
            # The lookup's top-up entry for exactly these candidates (gemm.py).
            extra = entries.stored(tc_keys.top_up_key(key, missing))
            if extra is not None:
                return {**timings, **extra}, False
            if not entries.transferred(key):
                return None
            return timings, True
        return timings, False

    return stored


def _device_type(kernel_inputs: Any, inputs: str) -> str:
    from .gemm import device_type_of

    device_type = getattr(kernel_inputs, "device_type", None)
    return str(device_type) if device_type else device_type_of([], inputs)


def _narrowing_finalize(orig: Callable[..., Any]) -> Callable[..., Any]:
    def _finalize_template_configs(self: Any, template_choices: Any, kernel_inputs: Any,
                                   templates: Any, op_name: str, *args: Any,
                                   **kwargs: Any) -> Any:
        ktcs = orig(self, template_choices, kernel_inputs, templates, op_name,
                    *args, **kwargs)
        plans = getattr(REGISTRY.gemm_local, "plans", None)
        hooks = REGISTRY.hooks
        # Someone else's lookup (a test's, a profiler's) chooses from the full list.
        if plans is None or hooks is None or hooks.count_only or hooks.broken \
                or REGISTRY.narrowing_off or not hooks.serving():
            return ktcs
        try:
            from torch._inductor import config

            if getattr(config, "multi_kernel_hints", None):
                return ktcs
            ktcs = list(ktcs)
            key = _gemm_key(op_name, kernel_inputs)
            entries = hooks.entries
            planned, templates = narrow(ktcs, _stored_for(entries, key))
            miss = not entries.known(key)  # entries.stored keeps every entry it finds
            if planned is None and templates >= 2 and miss:
                plan = entries.plan(key)
                planned = None if plan is None else decided_narrow(ktcs, plan)
                if planned is not None and plan is not None:
                    decided = planned[1][0] if planned[1] else str(plan.winner)
                    settled = entries.settle_decision(key, plan, decided)
                    if settled == "ours":
                        REGISTRY.stats.add(choice_lists_decided=1)
                    elif settled == "stored":
                        planned, templates = narrow(ktcs, _stored_for(entries, key))
                        plan = None
                    else:
                        planned = None
                if planned is None and plan is not None:
                    planned = transfer_narrow(ktcs, plan)
                    if planned is not None:
                        entries.note_not_generated(key, len(ktcs) - len(planned[0]))
                        REGISTRY.stats.add(choice_lists_transferred=1)
        except Exception as e:  # noqa: BLE001 - generate every choice, as without us
            hooks.warn_once(f"narrowing the {op_name} choices", e)
            return ktcs
        if planned is None:
            if templates >= 2:
                REGISTRY.stats.add(choice_lists_in_full=1)
            return ktcs
        kept, expected = planned
        plans.append(expected)
        REGISTRY.stats.add(choice_lists_narrowed=1,
                           choices_not_generated=len(ktcs) - len(kept))
        return kept

    return _finalize_template_configs


def _checking_get_template_configs(orig: Callable[..., Any]) -> Callable[..., Any]:
    def get_template_configs(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(REGISTRY.gemm_local, "plans", None)
        if REGISTRY.hooks is None or REGISTRY.narrowing_off:
            return orig(self, *args, **kwargs)
        plans: list[list[str]] = []
        REGISTRY.gemm_local.plans = plans
        try:
            choices = orig(self, *args, **kwargs)
        finally:
            REGISTRY.gemm_local.plans = outer
        if not plans:
            return choices
        actual = set()
        for choice in choices:
            try:
                actual.add(candidate_id(choice))
            except Exception:  # noqa: BLE001 - an unknown kind: not one we kept
                pass
        if all(pid in actual for plan in plans for pid in plan):
            return choices
        REGISTRY.narrowing_off = True
        log.warning(
            "tunecache: the Triton template choices Inductor generated are not the ones "
            "tunecache kept for a stored GEMM (this torch describes them differently); "
            "generating all of them, and every GEMM's choices from now on"
        )
        REGISTRY.stats.add(narrowing_mismatches=1)
        return orig(self, *args, **kwargs)

    return get_template_configs


def install_narrowing(ledger: Ledger, cache: CacheOpener, settings: Settings,
                      environment: Settings | None) -> bool:
    """Wrap InductorChoices.get_template_configs and _finalize_template_configs, through
    ``ledger`` (whatever the settings: a stored GEMM's entry decides); returns True."""
    from torch._inductor.choices import InductorChoices

    probe_narrowing()
    get = InductorChoices.__dict__.get("get_template_configs")
    fin = InductorChoices.__dict__.get("_finalize_template_configs")
    REGISTRY.narrowing_off = False
    ledger.patch(InductorChoices, "get_template_configs", _checking_get_template_configs(get))
    ledger.patch(InductorChoices, "_finalize_template_configs", _narrowing_finalize(fin))
    return True


def probe_narrowing() -> None:
    """Raise :class:`InductorChanged` where what narrowing wraps differs."""
    from torch._inductor import select_algorithm
    from torch._inductor.choices import InductorChoices

    get = InductorChoices.__dict__.get("get_template_configs")
    fin = InductorChoices.__dict__.get("_finalize_template_configs")
    require(*((f"select_algorithm.{name}", hasattr(select_algorithm, name))
              for name in ("ExternKernelChoice", "TritonTemplate", "create_inputs_key")))
    if not callable(get) or param_names(get)[:3] != ("kernel_inputs", "templates", "op_name"):
        raise InductorChanged("InductorChoices.get_template_configs(kernel_inputs, templates, "
                              "op_name, ...) changed")
    if not callable(fin) or param_names(fin)[:4] != (
            "template_choices", "kernel_inputs", "templates", "op_name"):
        raise InductorChanged("InductorChoices._finalize_template_configs(template_choices, "
                              "kernel_inputs, templates, op_name, ...) changed")


def _stop_narrowing() -> bool:
    return False  # narrowing holds nothing but its patches, which are the ledger's


NARROWING = Part(install_narrowing, _stop_narrowing,
                 "a stored GEMM still generates all its template choices",
                 probe=probe_narrowing)
