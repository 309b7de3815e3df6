"""The Triton tests' fixtures: tunecache enabled, and Inductor's coordinate descent,
fusion benchmarks and kernel compiles faked."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from autotune_helpers import (
    CACHELESS_TUNER,
    load,
    tuning_inductors_own,
)
from torch._inductor.runtime import autotune_cache as ac
from torch._inductor.runtime import triton_heuristics as th
from triton_fakes import (
    FakeKernel,
    FakeLauncher,
    TritonConfig,
    benchmark_harness,
    kernel_file,
    meta,
)

import tunecache
from tunecache.inductor.state import REGISTRY


@pytest.fixture
def enabled(tmp_path, monkeypatch):
    """tunecache enabled on a fresh SQLite file; yields the TuneCache."""
    cache = tunecache.open(str(tmp_path / "tune.db"))
    assert tunecache.enable(cache)
    tunecache.reset_stats()
    try:
        yield cache
    finally:
        tunecache.disable()
        cache.close()


@pytest.fixture
def coordesc(tmp_path, monkeypatch):
    """tunecache enabled over a faked Inductor coordinate descent (recorded in .tuned)."""
    tuned: list[Any] = []
    fail: list[bool] = []  # append to make the next tunings raise
    benchmarked: list[Any] = []  # kernels whose max-autotune configs were benchmarked
    inductors_own = tuning_inductors_own(tuned, fail)
    monkeypatch.setattr(th.CachingAutotuner, "coordinate_descent_tuning", inductors_own)

    def benchmark_all_configs(self, *args, **kwargs):  # Inductor's, faked: the last wins
        benchmarked.append(self)
        if fail:
            raise RuntimeError("benchmark failed")
        return {launcher: -i for i, launcher in enumerate(self.launchers)}

    def autotune_to_one_config(self, *args, **kwargs):  # Inductor's (2.11), faked
        timings = self.benchmark_all_configs(*args, **kwargs)
        self.launchers = [min(timings, key=timings.get)]

    monkeypatch.setattr(th.CachingAutotuner, "benchmark_all_configs", benchmark_all_configs)
    monkeypatch.setattr(th.CachingAutotuner, "autotune_to_one_config", autotune_to_one_config)
    monkeypatch.setattr(ac, "Config", TritonConfig)  # triton.Config; no triton on the CPU
    db = str(tmp_path / "tune.db")
    cache = tunecache.open(db)
    peer = tunecache.open(db)  # another rank: its own claim owner
    assert tunecache.enable(cache)
    # In place at enable(), not at the first kernel load in this process: with parallel
    # compile that can come after the forward graph's first run.
    assert th.CachingAutotuner.coordinate_descent_tuning is not inductors_own
    tunecache.reset_stats()

    def kernel(index: int = 0, body: str = "tmp0 + tmp1"):
        """A kernel as loaded on GPU ``index``: (kernel, its first launcher, shared key)."""
        m = meta(coordesc=True)
        cfgs, autotune_cache, info = load(kernel_file(tmp_path, index, body), m)
        k = FakeKernel(autotune_cache, m)
        k.autotune_cache_info = info
        key = REGISTRY.triton._key(autotune_cache.remote_cache_full_key,
                                       autotune_cache.remote_cache[1])[1]
        return k, FakeLauncher(cfgs[0]), key

    try:
        yield SimpleNamespace(cache=cache, peer=peer, tuned=tuned, kernel=kernel, fail=fail,
                              benchmarked=benchmarked)
    finally:
        tunecache.disable()
        cache.close()
        peer.close()
    assert th.CachingAutotuner.coordinate_descent_tuning is inductors_own
    assert th.CachingAutotuner.autotune_to_one_config is autotune_to_one_config


@pytest.fixture
def fusion(tmp_path, monkeypatch):
    """tunecache enabled over a faked TritonScheduling.benchmark_codegened_module: the
    modules it measured are in .measured, and it times each at .ms."""
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

    measured: list[str] = []  # modules whose benchmark started
    completed: list[str] = []  # and those that ran to the end
    # ms: a number, or f(module file); the module's kernel is tuned in .steps
    # coordinate-descent benchmarks of .seconds each; after_first_step(module file), if
    # set, runs after the first
    timing = SimpleNamespace(ms=0.25, seconds=0.0, steps=1, after_first_step=None)

    def inductors_own(self, mod, n_spills_threshold=8, node_names=None):
        measured.append(mod.__file__)
        for step in range(timing.steps):
            CoordescTuner.call_func(CACHELESS_TUNER, lambda _: time.sleep(timing.seconds),
                                    step)
            if step == 0 and timing.after_first_step is not None:
                timing.after_first_step(mod.__file__)
        ms = timing.ms(mod.__file__) if callable(timing.ms) else timing.ms
        completed.append(mod.__file__)
        return ms, mod.__file__

    monkeypatch.setattr(TritonScheduling, "benchmark_codegened_module", inductors_own)
    db = str(tmp_path / "tune.db")
    cache = tunecache.open(db)
    peer = tunecache.open(db)
    assert tunecache.enable(cache)
    tunecache.reset_stats()

    def benchmark(index: int, size: int = 1024) -> Any:
        """Rank ``index`` times the module Inductor wrote for one fusion candidate."""
        mod = SimpleNamespace(__file__=kernel_file(tmp_path, index,
                                                   tail=benchmark_harness(index, size)))
        return TritonScheduling.benchmark_codegened_module(object(), mod, 8)

    try:
        yield SimpleNamespace(benchmark=benchmark, measured=measured, completed=completed,
                              timing=timing, peer=peer, cache=cache)
    finally:
        tunecache.disable()
        cache.close()
        peer.close()
    assert TritonScheduling.benchmark_codegened_module is inductors_own


@pytest.fixture
def broken(enabled, monkeypatch):
    """tunecache enabled, with a faked Triton that refuses what tests put in
    FAILS_TO_COMPILE / FAILS_TO_LAUNCH."""
    import triton_fake_autotuner as fa

    monkeypatch.setattr(ac, "Config", TritonConfig)
    monkeypatch.setattr(fa, "FAILS_TO_COMPILE", [])
    monkeypatch.setattr(fa, "FAILS_TO_LAUNCH", [])
    # Their stored config is a coordinate-descent result, so a kernel that falls back to
    # Inductor's own first run descends from its own best config: faked, it finds nothing
    # better (this fake has no benchmark for a real descent).
    monkeypatch.setattr(fa.FakeAutotuner, "coordinate_descent_tuning",
                        lambda self, launcher, *args, **kwargs: launcher, raising=False)
    return SimpleNamespace(cache=enabled, fa=fa)
