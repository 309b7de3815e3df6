"""A kernel's coordinate descent with its next candidates compiled in threads
(tunecache/inductor/triton/compile_ahead.py): Inductor's own CoordescTuner runs the
descent, over a landscape of timings faked per config, and a kernel whose compile records
where it ran. Compiling ahead must change when a config is compiled, never what the
descent benchmarks, in which order, or what it finds.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from conftest import CompilesStarted  # noqa: E402
from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner  # noqa: E402
from torch._inductor.runtime.runtime_utils import triton_config_to_hashable  # noqa: E402
from triton_fakes import FakeConfig  # noqa: E402

from tunecache.inductor.triton.compile_ahead import (  # noqa: E402
    THREAD_NAME,
    AheadCompiler,
    compiling_ahead,
    compiling_descent_ahead,
)


class CompileError(Exception):
    """What Triton raises for a config it cannot build."""


class Kernel:
    """What the descent uses of a CachingAutotuner: its tuner and its compile, which
    records each config it compiled and the thread it ran in."""

    def __init__(self, fails: Any = lambda cfg: False, compile_seconds: float = 0.0) -> None:
        self.coordesc_tuner = CoordescTuner(name="triton_red_fused_sum_0",
                                            size_hints={"x": 4096, "r0_": 4096})
        self.compiled: list[tuple[Any, str]] = []
        self._fails = fails
        self._compile_seconds = compile_seconds
        self._lock = threading.Lock()

    def _precompile_config(self, cfg: Any) -> Any:
        time.sleep(self._compile_seconds)
        with self._lock:
            self.compiled.append((triton_config_to_hashable(cfg),
                                  threading.current_thread().name))
        if self._fails(cfg):
            raise CompileError(f"cannot compile {cfg}")
        return ("compiled", triton_config_to_hashable(cfg))


def landscape(cfg: Any) -> float:
    """Fastest at XBLOCK=8, R0_BLOCK=512, 8 warps: the descent walks several steps."""
    return (1.0 + abs(math.log2(cfg.kwargs["XBLOCK"] / 8))
            + 0.5 * abs(math.log2(cfg.kwargs["R0_BLOCK"] / 512))
            + 0.25 * abs(math.log2(cfg.num_warps / 8)))


def descend(kernel: Kernel, threads: int, compiles_started: CompilesStarted | None = None,
            ) -> tuple[Any, list[Any], AheadCompiler | None]:
    """Inductor's descent from XBLOCK=1, R0_BLOCK=2048, 2 warps, as
    ``CachingAutotuner.coordinate_descent_tuning`` runs it (compile, then benchmark):
    (the best config, the configs benchmarked in order, the compiler). With
    ``compiles_started``, each benchmark lasts until the compiles started so far ended
    (a GPU benchmark is longer than a compile)."""
    benchmarked: list[Any] = []

    def benchmark_one_config(cfg: Any) -> float:
        compiled = kernel._precompile_config(cfg)
        assert compiled == ("compiled", triton_config_to_hashable(cfg))
        benchmarked.append(triton_config_to_hashable(cfg))
        if compiles_started is not None:
            compiles_started.wait()
        return landscape(cfg)

    with compiling_descent_ahead(kernel, threads) as compiler:
        best = kernel.coordesc_tuner.autotune(
            benchmark_one_config, FakeConfig(2, XBLOCK=1, R0_BLOCK=2048), None)
    return triton_config_to_hashable(best), benchmarked, compiler


def test_a_descent_benchmarks_the_same_configs_in_the_same_order_with_them_compiled_ahead(
        compiles_started):
    best, benchmarked, compiler = descend(plain := Kernel(), threads=0)
    assert compiler is None
    assert {thread for _, thread in plain.compiled} == {threading.current_thread().name}
    assert dict(best)["XBLOCK"] == 8 and dict(best)["R0_BLOCK"] == 512
    assert len(benchmarked) > 10  # several steps, several fields

    ahead = Kernel()
    again, benchmarked_again, compiler = descend(ahead, threads=3,
                                                 compiles_started=compiles_started)
    assert (again, benchmarked_again) == (best, benchmarked)
    compiled_by = dict(ahead.compiled)
    assert len(compiled_by) == len(ahead.compiled)  # none twice
    # The baseline compiles in the descent's thread. Each time the best changes, the
    # first of its neighbours is asked for as it is submitted: that one is compiled
    # wherever it starts first, rather than wait in the queue. Every other config the
    # descent benchmarked was compiled in a thread while it benchmarked the one before.
    assert compiled_by[benchmarked[0]] == threading.current_thread().name
    changes = _best_changes([landscape_of(c) for c in benchmarked])
    ahead_of_time = [c for i, c in enumerate(benchmarked[1:], 1) if i - 1 not in changes]
    assert len(ahead_of_time) >= len(benchmarked) // 2
    assert all(compiled_by[c].startswith(THREAD_NAME) for c in ahead_of_time)
    assert compiler is not None and compiler.served >= len(ahead_of_time)


def landscape_of(hashable: Any) -> float:
    fields = dict(hashable)
    return landscape(FakeConfig(fields["num_warps"], XBLOCK=fields["XBLOCK"],
                                R0_BLOCK=fields["R0_BLOCK"]))


def _best_changes(timings: list[float]) -> set[int]:
    """The indices of the benchmarks after which the descent's best changed (the first,
    its baseline, included), by the tuner's own rule."""
    changes, best = {0}, timings[0]
    for i, ms in enumerate(timings[1:], 1):
        if CoordescTuner.has_improvement(best, ms):
            changes.add(i)
            best = ms
    return changes


def test_a_config_is_compiled_once_even_where_the_descent_moves_before_its_turn():
    # One slow thread: compiles of a best config the descent has left are dropped
    # before they start, or finish unused; none is compiled a second time.
    kernel = Kernel(compile_seconds=0.01)
    best, benchmarked, compiler = descend(kernel, threads=1)
    assert compiler is not None
    CompilesStarted.join_threads()
    counts = collections.Counter(c for c, _ in kernel.compiled)
    assert max(counts.values()) == 1
    assert set(benchmarked) <= set(counts)
    assert compiler.served <= compiler.compiled_ahead < len(counts)
    assert (best, benchmarked) == descend(Kernel(), threads=0)[:2]


def test_a_config_that_fails_to_compile_ahead_fails_where_the_descent_asks_for_it(
        compiles_started):
    def fails(cfg: Any) -> bool:
        return cfg.kwargs["XBLOCK"] == 2  # on the descent's way: it must step around

    plain = descend(Kernel(fails), threads=0)
    kernel = Kernel(fails)
    ahead = descend(kernel, threads=2, compiles_started=compiles_started)
    assert ahead[:2] == plain[:2]
    assert all(dict(c)["XBLOCK"] != 2 for c in ahead[1])
    # It failed in a thread, and the descent skipped it as it skips a failure of its own.
    failed = [t for c, t in kernel.compiled if dict(c)["XBLOCK"] == 2]
    assert failed and failed[0].startswith(THREAD_NAME)  # the baseline's neighbour


def test_after_the_descent_the_kernel_compiles_and_the_tuner_benchmarks_as_before():
    kernel = Kernel()
    tuner = kernel.coordesc_tuner
    descend(kernel, threads=2)
    assert "_precompile_config" not in vars(kernel) and "call_func" not in vars(tuner)
    kernel.compiled.clear()
    kernel._precompile_config(FakeConfig(4, XBLOCK=4, R0_BLOCK=64))
    assert [thread for _, thread in kernel.compiled] == [threading.current_thread().name]


def test_an_interrupted_descent_leaves_the_kernel_and_its_tuner_as_before():
    kernel = Kernel()

    def interrupted(cfg: Any) -> float:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), compiling_descent_ahead(kernel, 2):
        kernel.coordesc_tuner.autotune(interrupted, FakeConfig(2, XBLOCK=1, R0_BLOCK=8),
                                       None)
    assert "_precompile_config" not in vars(kernel)
    assert "call_func" not in vars(kernel.coordesc_tuner)


def test_where_compiling_ahead_fails_the_descent_compiles_each_config_itself(monkeypatch):
    def broken(self: AheadCompiler, configs: Any) -> None:
        raise RuntimeError("a tuner we do not know")

    monkeypatch.setattr(AheadCompiler, "submit", broken)
    kernel = Kernel()
    assert descend(kernel, threads=2)[:2] == descend(Kernel(), threads=0)[:2]
    assert {thread for _, thread in kernel.compiled} == {threading.current_thread().name}


def test_a_kernel_without_inductors_tuner_is_left_alone():
    kernel = Kernel()
    kernel.coordesc_tuner = object()
    with compiling_descent_ahead(kernel, 2) as compiler:
        assert compiler is None and "_precompile_config" not in vars(kernel)


def test_configs_compiled_ahead_all_at_once_are_each_handed_out_once(compiles_started):
    kernel = Kernel(fails=lambda cfg: cfg.kwargs["XBLOCK"] == 64)
    configs = [FakeConfig(4, XBLOCK=x, R0_BLOCK=8) for x in (16, 32, 64)]
    with compiling_ahead(kernel._precompile_config, configs, 2) as compiler:
        compiles_started.wait()
        assert compiler.compiled(configs[1]) == ("compiled", triton_config_to_hashable(
            configs[1]))
        with pytest.raises(CompileError):
            compiler.compiled(configs[2])
        # Asked again: not the thread's compile (handed out already) but a new one here.
        compiler.compiled(configs[1])
    assert (compiler.compiled_ahead, compiler.served) == (3, 2)
    threads = [t for c, t in kernel.compiled if c == triton_config_to_hashable(configs[1])]
    assert threads[0].startswith(THREAD_NAME)
    assert threads[1] == threading.current_thread().name


def test_a_config_no_thread_has_started_compiles_where_it_is_asked_for():
    # One thread, busy with the first config: the second would wait in the queue behind
    # it, so it is compiled in the asking thread instead.
    busy, release = threading.Event(), threading.Event()
    kernel = Kernel()
    compile_config = kernel._precompile_config

    def first_blocks(cfg: Any) -> Any:
        if cfg.kwargs["XBLOCK"] == 16:
            busy.set()
            release.wait(timeout=60)
        return compile_config(cfg)

    configs = [FakeConfig(4, XBLOCK=x, R0_BLOCK=8) for x in (16, 32)]
    safety = threading.Timer(10, release.set)  # without the fix: no hang, a failure
    safety.start()
    try:
        with compiling_ahead(first_blocks, configs, 1) as compiler:
            assert busy.wait(timeout=60)
            compiler.compiled(configs[1])
            assert not release.is_set()  # it did not wait for the first
            release.set()
    finally:
        safety.cancel()
    assert [t for c, t in kernel.compiled if c == triton_config_to_hashable(configs[1])] \
        == [threading.current_thread().name]
    assert (compiler.compiled_ahead, compiler.served) == (1, 0)

