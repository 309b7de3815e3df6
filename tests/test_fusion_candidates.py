"""A fusion candidate whose benchmark timing is stored is never compiled
(tunecache/inductor/triton/candidates.py).

Triton is not installed on the CPU test machines. These tests run Inductor's real
``Scheduler.compile_kernel`` (which generates a candidate module, loads it and hands its
source to ``AsyncCompile.triton``) with a fake code generator, a fake module loader (Inductor's
writes the source to a file and imports it, which needs Triton) and a fake
``AsyncCompile.triton`` that records each compile, then time the module through
``TritonScheduling.benchmark_codegened_module`` as ``speedup_by_fusion`` does.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, as_completed
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch._inductor import config as inductor_config  # noqa: E402
from triton_fakes import benchmark_harness, kernel_source  # noqa: E402

import tunecache  # noqa: E402


class _Node:
    def __init__(self, template: bool) -> None:
        self.template = template

    def is_template(self) -> bool:
        return self.template


@pytest.fixture
def candidates(tmp_path, monkeypatch):
    """tunecache enabled over fake compile and benchmark functions; .compiled lists the
    sources Triton compiled, .measured the modules benchmarked."""
    from torch._inductor import codecache
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codecache import LambdaFuture
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.scheduler import Scheduler

    compiled: list[str] = []
    measured: list[str] = []

    def triton(self, kernel_name, source_code, device_str="cuda"):
        compiled.append(source_code)  # ptxas, in the compile workers
        done: Future = Future()
        done.set_result(None)
        return LambdaFuture(lambda: "kernel", done)

    def load(source_code, extra=""):
        digest = hashlib.sha256(source_code.encode()).hexdigest()[:16]
        path = tmp_path / "modules" / f"c{digest}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(source_code)
        # A kernel module has its kernel: 2.15's compile_kernel compiles nothing without.
        return SimpleNamespace(__file__=str(path), triton_=object())

    def benchmark(self, mod, n_spills_threshold=8, node_names=None):
        measured.append(mod.__file__)
        return 0.5, mod.__file__

    monkeypatch.setattr(AsyncCompile, "triton", triton)
    monkeypatch.setattr(AsyncCompile, "use_process_pool", lambda self: True)
    monkeypatch.setattr(codecache.PyCodeCache, "load", staticmethod(load))
    monkeypatch.setattr(TritonScheduling, "benchmark_codegened_module", benchmark)
    own = (Scheduler.__dict__["compile_kernel"], AsyncCompile.__dict__["triton"])
    cache = tunecache.open(str(tmp_path / "tune.db"))
    assert tunecache.enable(cache)
    tunecache.reset_stats()

    def fuse(index: int, size: int = 1024, template: bool = True) -> float:
        """Rank ``index`` decides one fusion: speedup_by_fusion's compile, wait and time."""
        source = kernel_source(index, tail=benchmark_harness(index, size))
        scheduler = SimpleNamespace(
            generate_kernel_code_from_nodes=lambda nodes, benchmark_kernel, **kw: source)
        future, mod = Scheduler.compile_kernel(scheduler, [_Node(template), _Node(False)])
        if future is not None:
            # As _evaluate_pending_template_fusions waits for a pending template fusion:
            # on the worker's own future, which must be there.
            assert future.future is not None
            for _ in as_completed([future.future], timeout=10):
                future.result()
        ms, _ = TritonScheduling.benchmark_codegened_module(object(), mod)
        return ms

    try:
        yield SimpleNamespace(fuse=fuse, compiled=compiled, measured=measured)
    finally:
        tunecache.disable()
        cache.close()
    assert (Scheduler.__dict__["compile_kernel"], AsyncCompile.__dict__["triton"]) == own


def _counts() -> tuple[int, int]:
    stats = tunecache.stats().triton.as_dict()
    return stats["fusion_candidates_compiled"], stats["fusion_compiles_skipped"]


def test_a_fusion_candidate_with_a_stored_timing_is_timed_without_compiling(candidates):
    with inductor_config.patch(benchmark_epilogue_fusion=True):
        assert candidates.fuse(0) == 0.5  # cold: compiled, measured, published
        assert (len(candidates.compiled), len(candidates.measured)) == (1, 1)
        # Another rank (its source names another GPU), or a later job: the stored timing.
        assert candidates.fuse(1) == 0.5
    assert (len(candidates.compiled), len(candidates.measured)) == (1, 1)
    assert _counts() == (1, 1)


def test_a_candidate_nobody_measured_is_compiled_as_before(candidates):
    with inductor_config.patch(benchmark_epilogue_fusion=True):
        candidates.fuse(0)
        candidates.fuse(0, size=2048)  # another module: a miss
    assert len(candidates.compiled) == 2 and len(candidates.measured) == 2
    assert _counts() == (2, 0)


def test_without_epilogue_benchmarking_a_template_candidate_is_compiled_even_if_stored(
        candidates):
    # The scheduler then reads the compiled kernel's registers, not a timing.
    with inductor_config.patch(benchmark_epilogue_fusion=True):
        candidates.fuse(0)
    with inductor_config.patch(benchmark_epilogue_fusion=False):
        candidates.fuse(1)
    assert len(candidates.compiled) == 2
    assert _counts() == (1, 0)


def test_a_benchmarked_fusion_of_two_kernels_with_a_stored_timing_is_not_compiled(
        candidates):
    with inductor_config.patch(benchmark_fusion=True):
        candidates.fuse(0, template=False)
        candidates.fuse(1, template=False)
    assert len(candidates.compiled) == 1 and _counts() == (1, 1)
    with inductor_config.patch(benchmark_fusion=False):
        candidates.fuse(1, template=False)  # not benchmarked by the scheduler: compiled
    assert len(candidates.compiled) == 2


def test_a_failing_store_read_compiles_the_candidate(candidates, monkeypatch):
    from tunecache.inductor.state import REGISTRY

    with inductor_config.patch(benchmark_epilogue_fusion=True):
        candidates.fuse(0)

        def broken() -> Any:
            raise RuntimeError("database gone")

        monkeypatch.setattr(REGISTRY.triton, "cache", broken)
        with pytest.raises(RuntimeError):
            REGISTRY.triton.cache()
        candidates.fuse(1)  # compiled; the benchmark then runs as usual too
    assert len(candidates.compiled) == 2
    assert tunecache.stats().triton.as_dict()["errors"] >= 1
