"""The deferred pre-fusion pass: tunes all of a graph's deferred GEMMs in one go.

Deferred path (GPU default, ``benchmark_epilogue_fusion=True``)
    Lowering returns ``MultiTemplateBuffer``s whose timings are computed lazily, one at a
    time, during fusion. We chain ``config._pre_fusion_custom_pass`` (keeping any pass
    already there: it runs first) to see all of the graph's deferred GEMMs at once, call
    ``get_or_tune_many`` over their keys, and tune a key by calling the buffer's
    ``choice_timings()`` (what Inductor's own distributed autotune does). So every rank
    benchmarks only the keys it claimed and waits for its peers only at the end. Ranks
    that compile different graphs cannot hang: a rank waits only for keys that a peer
    has claimed, and a claimer tunes every key it claims before it waits; an expired
    claim is taken over by the core. Our pass is a ``CustomSchedulerPass`` (torch 2.13)
    and a ``CustomGraphPass`` (what torch 2.11's cache checks) with a stable ``uuid()``,
    so the FX graph and AOTAutograd caches keep working (anything else makes Inductor
    bypass them, torch/_inductor/codecache.py); if the pass we chain is a raw callable we
    stay a raw callable too, so Inductor still bypasses as it would have.

"""

from __future__ import annotations

import logging
import time
from typing import Any

from .. import keys as tc_keys
from ..core.result import Tuned
from ..process import PROCESS
from .gemm import GemmHooks, device_type_of, gemm_key
from .state import REGISTRY

__all__ = ["make_pre_fusion_pass", "tune_deferred"]

log = logging.getLogger("tunecache")


def tune_deferred(hooks: GemmHooks, nodes: list[Any]) -> None:
    """Claim, tune and wait for all of a graph's deferred GEMMs in one go."""
    if hooks.count_only or hooks.broken or not hooks.serving():
        return  # someone else's lookup times these buffers, not ours
    from torch._inductor import ir
    from torch._inductor.scheduler import SchedulerNode

    hooks.check_distributed_flag()
    keys: list[tc_keys.Key] = []
    owners: dict[str, Any] = {}  # key hash -> first buffer with that key
    unknown = 0
    for node in nodes:
        buf = getattr(node, "node", None)
        if not isinstance(node, SchedulerNode) or not isinstance(buf, ir.MultiTemplateBuffer):
            continue
        choices = buf.choices
        if not choices or None in getattr(buf, "_choice_timings", {}):
            continue  # a placeholder (distributed autotune) or already timed
        info = hooks.pending.get(choices[0])
        if info is None or info.list_id != id(choices):
            unknown += 1  # not lowered through our hook; lookup handles it lazily
            continue
        op, inputs_key = info.op, info.inputs_key
        key = gemm_key(op, inputs_key, None, device_type_of(choices, inputs_key))
        if hooks.entries.known(key):
            continue
        if key.hash not in owners:
            owners[key.hash] = buf
            keys.append(key)
    if unknown:
        # Expected never; if a torch version stops passing the same list to
        # make_precompile_fn and MultiTemplateBuffer, those GEMMs still go through
        # lookup() one at a time (correct, only less parallel across ranks).
        log.info("tunecache: %d deferred GEMM(s) not recognised; tuned one by one", unknown)
    if not keys:
        return

    def tune(key: tc_keys.Key) -> Tuned:
        with hooks.entries.tuning_slot(key) as slot:
            # The buffer's own timing function: precompile, prescreen, benchmark,
            # each benchmark routed through lookup(), which fills `slot`.
            owners[key.hash].choice_timings()
        if not slot.timings:
            raise RuntimeError("Inductor produced no timings for this key")
        return Tuned(slot.timings, slot.meta)

    t0 = time.perf_counter()
    results = hooks.cache().get_or_tune_many(keys, tune)
    for key, result in zip(keys, results):
        # A "failed" key (its tuner failed too often) has no usable timings: lookup()
        # then asks the core again, gets KeyFailedError, and leaves the op to
        # Inductor's own lookup.
        if result.source != "failed" and result.timings:
            hooks.entries.note(key, result.timings, result.meta)
    for key, result in zip(keys, results):
        event = {"op": key.mapping["op"], "key_hash": result.key_hash, "best": result.best,
                 "candidates": len(owners[result.key_hash].choices)}
        REGISTRY.stats.record(result.source, event)
    log.info(
        "tunecache: %d deferred GEMM key(s) of this graph ready in %.1fs (%s)",
        len(keys),
        time.perf_counter() - t0,
        ", ".join(sorted({r.source for r in results})),
    )


def _scheduler_pass_bases() -> tuple[type, ...]:
    """The classes Inductor's FX graph cache accepts for ``_pre_fusion_custom_pass``.

    torch 2.13 checks ``isinstance(pass, CustomSchedulerPass)``; torch 2.11, before
    pytorch/pytorch#179050 added that class, checks ``CustomGraphPass`` and reads its
    ``uuid()`` (codecache.py, ``_check_can_cache``). Anything else is a bypass of the FX
    graph cache, and with it of the AOTAutograd cache, on every compile. Deriving from
    each of them that exists satisfies either check.
    """
    from torch._inductor import custom_graph_pass

    names = ("CustomSchedulerPass", "CustomGraphPass")
    return tuple(getattr(custom_graph_pass, n) for n in names if hasattr(custom_graph_pass, n))


def make_pre_fusion_pass(hooks: GemmHooks, prev: Any) -> Any:
    """Our scheduler pass, chained after ``prev`` (see this module's docstring)."""
    bases = _scheduler_pass_bases()

    def run(nodes: list[Any]) -> list[Any]:
        if prev is not None:
            nodes = prev(nodes)
        if REGISTRY.hooks is hooks:
            PROCESS.compiled = True
            try:
                tune_deferred(hooks, nodes)
            except Exception as e:  # noqa: BLE001 - fusion then benchmarks lazily, per key
                # This includes an error of Inductor's own benchmark: fusion asks the same
                # buffer again, and the error is raised there, where Inductor raises it.
                hooks.warn_once("tuning the graph's deferred GEMMs", e)
        return nodes

    if not bases or (prev is not None and not isinstance(prev, bases)):
        # A raw callable makes Inductor bypass the FX graph cache; stay raw so it still
        # does (torch/_inductor/codecache.py, _pre_fusion_custom_pass check).
        def tunecache_pre_fusion_pass(nodes: list[Any]) -> list[Any]:
            return run(nodes)

        # An attribute of the function itself, read back when tunecache is disabled.
        tunecache_pre_fusion_pass.tunecache_prev = prev  # type: ignore[attr-defined]
        return tunecache_pre_fusion_pass

    # The bases are Inductor's, found at run time (a version has them or not).
    class TuneCachePreFusionPass(*bases):  # type: ignore[misc]
        tunecache_prev = prev

        def __call__(self, nodes: list[Any]) -> list[Any]:
            return run(nodes)

        def uuid(self) -> Any:
            # The pass changes no generated code (it only benchmarks earlier), so the FX
            # graph cache key needs only the chained pass's identity.
            return ("tunecache-pre-fusion-v1", prev.uuid() if prev is not None else None)

    return TuneCachePreFusionPass()
