"""One rank of tests/triton_autotune/test_triton_two_processes.py, run as a script:
``rank_worker.py ROLE DB TMP INDEX ...`` prints its result as one JSON line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import procs
from autotune_helpers import (
    CACHELESS_TUNER,
    load,
    size_of,
    split_size_search,
    timing_by_size,
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
from tunecache import inductor as tc_inductor
from tunecache.inductor.triton import coordesc as tc_coordesc


def _split_size_rank(db: str, tmp: str, index: int) -> None:
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

    measured: list[int] = []

    def inductors_own(self, mod, n_spills_threshold=8, node_names=None):
        measured.append(size_of(mod.__file__))
        for step in range(5):  # the kernel's coordinate descent: the time it takes
            CoordescTuner.call_func(CACHELESS_TUNER, lambda _: time.sleep(0.1), step)
        return timing_by_size(mod.__file__, best=128) + index / 1000, mod.__file__

    TritonScheduling.benchmark_codegened_module = inductors_own
    cache = tunecache.open(db)
    tunecache.enable(cache)
    procs.file_barrier(Path(tmp), index, 2)

    def benchmark(rank: int, size: int) -> Any:
        mod = SimpleNamespace(__file__=kernel_file(Path(tmp), rank,
                                                   tail=benchmark_harness(rank, size)))
        return TritonScheduling.benchmark_codegened_module(object(), mod, 8)

    best = split_size_search(benchmark, index)
    stats = tunecache.stats().triton.as_dict()
    tunecache.disable()
    print(json.dumps({"best": best, "measured": measured,
                      "left_to_peer": stats["fusion_left_to_peer"],
                      "ahead": stats["split_values_ahead"],
                      "stopped": stats["split_values_stopped"]}))


def _rank_main(role: str, db: str, tmp: str, index: int) -> None:
    cache = tunecache.open(db)
    tunecache.enable(cache)
    cfgs, autotune_cache, info = load(kernel_file(Path(tmp), index), meta())
    if role == "tune":
        assert len(cfgs) == 3
        cfgs = [cfgs[1]]  # "benchmarked": the second config won
        autotune_cache.save(cfgs[0], 5_000_000)
    tunecache.disable()
    best = cfgs[0]
    print(json.dumps({"state": info["autotune_cache_state"],
                      "best": [best.kwargs, best.num_warps, best.num_stages],
                      "stats": tunecache.stats().triton.as_dict()}))


def _coordesc_rank(db: str, tmp: str, index: int, kernels: int, tune_seconds: float,
                   barrier: bool, lease: float) -> None:
    """One rank of the real-process tests: ``kernels`` kernels run step after step until
    each runs a config found by coordinate descent, with a fake coordinate descent that takes
    ``tune_seconds`` and finds a rank-specific config (so a kernel tuned twice, or not
    adopted, shows), under claims of ``lease`` seconds.
    It marks tmp/tuning-<index> when it starts tuning."""
    tuned: list[int] = []
    benchmarked: list[int] = []

    def benchmark_all_configs(self, *args, **kwargs):  # Inductor's, faked: the last wins
        benchmarked.append(self.number)
        time.sleep(tune_seconds / 3)  # benchmarking takes time: the behaviour
        return {launcher: -i for i, launcher in enumerate(self.launchers)}

    def autotune_to_one_config(self, *args, **kwargs):  # Inductor's (2.11), faked
        timings = self.benchmark_all_configs(*args, **kwargs)
        self.launchers = [min(timings, key=timings.get)]

    def inductors_own(self, launcher, *args, **kwargs):
        tuned.append(self.number)
        (Path(tmp) / f"tuning-{index}").touch()
        time.sleep(tune_seconds)  # tuning takes time: the behaviour
        best = TritonConfig({"XBLOCK": 2 ** (6 + index)}, 4, 1)
        self.save_cache_hook(best, int(tune_seconds * 1e9), found_by_coordesc=True)
        best.found_by_coordesc = True
        return FakeLauncher(best)

    th.CachingAutotuner.coordinate_descent_tuning = inductors_own
    th.CachingAutotuner.autotune_to_one_config = autotune_to_one_config
    th.CachingAutotuner.benchmark_all_configs = benchmark_all_configs
    ac.Config = TritonConfig
    tc_inductor.TRITON_LEASE_SECONDS = lease
    cache = tunecache.open(db)
    tunecache.enable(cache)
    loaded = []
    for i in range(kernels):
        m = meta(coordesc=True)
        cfgs, autotune_cache, _info = load(kernel_file(Path(tmp), index, f"tmp0 + {i}"), m)
        kernel = FakeKernel(autotune_cache, m)
        kernel.number = i
        kernel.launchers = [FakeLauncher(c) for c in cfgs]
        loaded.append(kernel)
    if barrier:  # start together, as ranks after a barrier
        procs.file_barrier(Path(tmp), index, 2)
    tc_coordesc.DEFERRED_CHECK_SECONDS = 0.01
    deadline = time.monotonic() + 60
    while True:  # training steps, until every kernel runs its final config
        pending = [k for k in loaded
                   if not getattr(k.launchers[0].config, "found_by_coordesc", False)]
        if not pending or time.monotonic() > deadline:
            break
        for k in pending:  # CachingAutotuner.run, as far as we care
            if len(k.launchers) > 1:
                th.CachingAutotuner.autotune_to_one_config(k)
            k.launchers = [th.CachingAutotuner.coordinate_descent_tuning(k, k.launchers[0])]
        time.sleep(0.02)  # the rest of a training step: pacing, not a wait for anything
    stats = tunecache.stats().triton.as_dict()
    tunecache.disable()
    print(json.dumps({
        "tuned": tuned,
        "benchmarked": benchmarked,
        "final": [[k.launchers[0].config.kwargs, k.launchers[0].config.num_warps,
                   getattr(k.launchers[0].config, "found_by_coordesc", False)]
                  for k in loaded],
        "deferred": stats["deferred"],
        "peer_wait_seconds": stats["peer_wait_seconds"],
    }))


if __name__ == "__main__":
    if sys.argv[1] == "split-size":
        _split_size_rank(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "coordesc":
        _coordesc_rank(sys.argv[2], sys.argv[3], int(sys.argv[4]), kernels=int(sys.argv[5]),
                       tune_seconds=float(sys.argv[6]), barrier=sys.argv[7] == "barrier",
                       lease=float(sys.argv[8]))
    else:
        _rank_main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
