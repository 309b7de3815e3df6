"""Fusion candidates whose timing is stored are not compiled.

To decide a benchmarked fusion, ``Scheduler.speedup_by_fusion`` calls
``Scheduler.compile_kernel(nodes, ...)`` for each candidate module (the template with its
epilogue for every top choice of a ``MultiTemplateBuffer``; the two kernels and their
fusion under ``config.benchmark_fusion``), waits for the futures, and only then times each
module with ``benchmark_codegened_module``, which :mod:`.fusion` answers from the shared
cache. ``compile_kernel`` generates the module, loads it (plain Python, cheap) and, with
parallel compile on, hands its source to ``AsyncCompile.triton``, which starts the Triton
compile (ptxas, about 2 s per template kernel) in the compile workers (2.11-2.14).
So a warm job compiled every candidate only to be answered from the database.

Here ``compile_kernel`` marks its thread, and ``AsyncCompile.triton`` called under that
mark looks up the module's fusion-benchmark key (the same :func:`.keys.fusion_benchmark_key`
of the same source, with the threshold ``"default"`` that the scheduler's benchmark call
leaves) without claiming: a stored timing returns a future that compiles nothing, so the
scheduler goes straight to the benchmark, which returns the stored timing. Inductor
decides on the same timing as the job that measured it. A module nobody measured is
compiled as before, and :mod:`.fusion` claims, measures and publishes it.

When it skips
    Only where the scheduler benchmarks what it compiled: a candidate with a template
    under ``config.benchmark_epilogue_fusion`` and one without under
    ``config.benchmark_fusion``. Without epilogue benchmarking the scheduler reads the
    compiled kernel's registers instead of a timing (``_fuse_epilogue``), so a compile
    is needed there. A stored timing also means the module compiled when it was
    measured: the future's only other use, raising a compile error, cannot differ.
    The kernel a fusion picks is compiled later by the normal code generation, as
    always.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..compat import inductor_config, param_names
from ..state import REGISTRY
from .kernel_keys import fusion_benchmark_key, fusion_ms_from_entry

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...patching import Ledger

__all__ = ["install_candidate_skip"]

log = logging.getLogger("tunecache")


def _benchmarked(nodes: Any) -> bool:
    """Whether the scheduler times the module compile_kernel builds for ``nodes``."""
    from torch._inductor import config

    try:
        template = any(n.is_template() for n in nodes)
    except Exception:  # noqa: BLE001 - unknown node kinds: compile as usual
        return False
    if template:
        return bool(inductor_config("benchmark_template_fusion", "benchmark_epilogue_fusion",
                                    False))
    return bool(config.benchmark_fusion)


def stored_fusion_ms(source: str) -> float | None:
    """The stored timing of the fusion benchmark of a module with this source, or None;
    a plain read (no claim, no wait)."""
    state = REGISTRY.triton
    if state is None:
        return None
    answer = state.cache().lookup(fusion_benchmark_key(source, "default"))
    if answer is None or answer.source == "failed":
        return None
    return fusion_ms_from_entry(answer.timings)


def _skipping_compile_kernel(orig: Callable[..., Any]) -> Callable[..., Any]:
    def compile_kernel(self: Any, nodes: Any, *args: Any, **kwargs: Any) -> Any:
        local = REGISTRY.fusion_local
        outer = getattr(local, "candidate", False)
        local.candidate = REGISTRY.triton is not None and _benchmarked(nodes)
        try:
            return orig(self, nodes, *args, **kwargs)
        finally:
            local.candidate = outer

    return compile_kernel


def _compiled_nothing(lambda_future: type) -> Any:
    """A finished future (Inductor's ``LambdaFuture``) of a compile that did not happen.
    The scheduler waits for pending template fusions on the worker's own future
    (``as_completed(future.future)``, ``_evaluate_pending_template_fusions``), so it must
    be a real one, already done."""
    from concurrent.futures import Future

    done: Future[None] = Future()
    done.set_result(None)
    future = lambda_future(lambda: None)
    future.future = done  # an attribute in 2.11-2.14; not a parameter everywhere
    return future


def _skipping_triton(orig: Callable[..., Any], lambda_future: type) -> Callable[..., Any]:
    def triton(self: Any, kernel_name: str, source_code: str, *args: Any,
               **kwargs: Any) -> Any:
        if not getattr(REGISTRY.fusion_local, "candidate", False):
            return orig(self, kernel_name, source_code, *args, **kwargs)
        REGISTRY.fusion_local.candidate = False  # one module per compile_kernel
        state = REGISTRY.triton
        stored = None  # also where reading it fails: compile it, as without tunecache
        if state is not None:
            with state.attempt("reading a fusion candidate's stored timing"):
                stored = stored_fusion_ms(source_code)
        if stored is None:
            REGISTRY.triton_stats.add(fusion_candidates_compiled=1)
            return orig(self, kernel_name, source_code, *args, **kwargs)
        REGISTRY.triton_stats.add(fusion_compiles_skipped=1)
        return _compiled_nothing(lambda_future)

    return triton


def install_candidate_skip(patches: Ledger) -> None:
    """Wrap Scheduler.compile_kernel and AsyncCompile.triton, through ``patches``."""
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codecache import LambdaFuture
    from torch._inductor.scheduler import Scheduler

    compile_kernel = Scheduler.__dict__.get("compile_kernel")
    triton = AsyncCompile.__dict__.get("triton")
    if not callable(compile_kernel) or param_names(compile_kernel)[:1] != ("nodes",):
        raise TypeError("Scheduler.compile_kernel(nodes, ...) changed")
    if not callable(triton) or param_names(triton)[:2] != ("kernel_name", "source_code"):
        raise TypeError("AsyncCompile.triton(kernel_name, source_code, ...) changed")
    patches.patch(Scheduler, "compile_kernel", _skipping_compile_kernel(compile_kernel))
    patches.patch(AsyncCompile, "triton", _skipping_triton(triton, LambdaFuture))
