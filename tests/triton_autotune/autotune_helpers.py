"""Helpers of the tests of tunecache.inductor's Triton section (tests/triton_autotune).

Triton is not installed on the CPU test machines, but Inductor's autotune-cache code is
pure Python: these tests drive Inductor's own ``check_autotune_cache`` ->
``AutotuneCache.create`` -> ``read_best`` and ``AutotuneCache.save`` (the calls a kernel
load and its first run make, torch/_inductor/runtime/triton_heuristics.py) with fake
configs and generated-looking kernel files. The two-process tests run rank_worker.py so
that each "rank" is its own process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import procs
from torch._inductor.runtime import autotune_cache as ac
from torch._inductor.runtime import triton_heuristics as th
from triton_fakes import (
    FakeConfig,
    FakeLauncher,
    TritonConfig,
    benchmark_harness,
    configs,
    kernel_file,
    kernel_source,
    meta,
)

from tunecache import inductor as tc_inductor
from tunecache.core import TuneCache

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
RANK_WORKER = Path(__file__).with_name("rank_worker.py")


def rank_env() -> dict[str, str]:
    """A rank's environment: none of this process's TUNECACHE_ variables, and the
    repository and tests/ (procs, triton_fakes) importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(TESTS),
                                                      env.get("PYTHONPATH")]))
    return env


def load(filename: str, m: dict[str, Any], cfgs: list[FakeConfig] | None = None):
    """What a kernel load does: Inductor's check_autotune_cache."""
    return th.check_autotune_cache(cfgs or configs(), filename, m)


def create(filename: str, m: dict[str, Any]):
    """Inductor's AutotuneCache for a kernel, without reading it (no claim)."""
    return ac.AutotuneCache.create(m, filename, th.hash_configs(configs()))


def stored(cache: TuneCache) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from tunecache.store.schema import entries

    def work(conn: Any) -> list[dict[str, Any]]:
        rows = conn.execute(select(entries.c.kind, entries.c.state, entries.c.timings_json,
                                   entries.c.attempts))
        return [dict(r._mapping) for r in rows]

    return cache.store.db.run(work)


TUNED = FakeConfig(16, XBLOCK=1024)  # what the fake coordinate descent "finds"


def tuning_inductors_own(tuned: list[Any], fail: list[bool]):
    def coordinate_descent_tuning(self, launcher, *args, **kwargs):  # Inductor's, faked
        tuned.append(launcher)
        if fail:
            raise RuntimeError("benchmark failed")
        best = TritonConfig(dict(TUNED.kwargs), TUNED.num_warps, TUNED.num_stages)
        self.save_cache_hook(best, 9_000_000, found_by_coordesc=True)
        best.found_by_coordesc = True
        return FakeLauncher(best)

    return coordinate_descent_tuning


def first_run(kernel: Any, launcher: Any) -> Any:
    """What CachingAutotuner.run does while the config is not found_by_coordesc."""
    return th.CachingAutotuner.coordinate_descent_tuning(kernel, launcher)


def publish_as_peer(peer: TuneCache, claim: Any, kernel: Any, config: FakeConfig) -> None:
    """Publish a coordinate-descent result the way a peer's AutotuneCache.save does."""
    from tunecache.keys import canonical_json

    entry = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages,
             "configs_hash": kernel.save_cache_hook.__self__.configs_hash,
             "found_by_coordesc": True}
    assert peer.publish(claim, {canonical_json(entry): 2.5}) is not None


def publish_while_waiting(cache: TuneCache, publish: Callable[[], object],
                           reads: int = 2) -> threading.Thread:
    """Run a peer's ``publish`` once this thread has read the key ``reads`` times through
    ``cache``: it has seen the peer's claim and is waiting on it. (A timer could fire
    before the wait began on a loaded machine, and the key would be a plain hit.)"""
    waiting = procs.after_reads(cache, reads)
    thread = threading.Thread(target=lambda: waiting.wait(120) and publish(), daemon=True)
    thread.start()
    return thread


def first_run_while_the_peer_tunes(coordesc: Any) -> Any:
    """A kernel's first run while the peer holds its claim and publishes during its wait."""
    k, launcher, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key)
    # Three reads: the lookup, the claim's, and one while waiting.
    peer = publish_while_waiting(coordesc.cache, lambda: publish_as_peer(
        coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256)), reads=3)
    try:
        return first_run(k, launcher)
    finally:
        peer.join(60)


def one_config(kernel: Any) -> Any:
    """What CachingAutotuner.run does first with a kernel of several configs."""
    kernel.launchers = [FakeLauncher(c) for c in configs()]
    th.CachingAutotuner.autotune_to_one_config(kernel)
    assert "benchmark_all_configs" not in kernel.__dict__  # the method is Inductor's again
    (launcher,) = kernel.launchers
    return launcher


# What CoordescTuner.call_func needs of its tuner, with nothing cached.
CACHELESS_TUNER = SimpleNamespace(lookup_in_cache=lambda config: None,
                                   cache_benchmark_result=lambda config, timing: None)


def fusion_key(size: int = 1024) -> dict[str, Any]:
    """The key of the module ``fusion.benchmark(index, size)`` times, on any rank."""
    return tc_inductor.fusion_benchmark_key(
        kernel_source(0, tail=benchmark_harness(0, size)), 8)


def split_size_search(benchmark: Any, index: int) -> int:
    """Inductor's split-size search of a mix-order reduction (codegen/simd.py): each
    candidate value is its own module, benchmarked through benchmark_codegened_module."""
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

    return CoordescTuner.autotune_single_field(
        lambda value: benchmark(index, value)[0], 16, 8)


def size_of(file: str) -> int:
    """The split size a benchmark harness (:func:`benchmark_harness`) measures."""
    return int(re.search(r"rand_strided\(\((\d+),\)", Path(file).read_text()).group(1))


def timing_by_size(file: str, best: int = 32) -> float:
    """A parabola-like curve over the split size (the module's size)."""
    return 1.0 + abs(math.log2(size_of(file)) - math.log2(best))


def sizes(files: list[str]) -> list[int]:
    return [size_of(f) for f in files]


def when_measuring(size: int, peer_publishes: Callable[[], Any]) -> Callable[[str], None]:
    """An after_first_step hook: the peer publishes while this rank measures ``size``."""
    def hook(file: str) -> None:
        if sizes([file]) == [size]:
            peer_publishes()
    return hook


# Reduction-like configs: the constexprs this kernel's configs use are XBLOCK and R0_BLOCK.
def own_configs() -> list[FakeConfig]:
    return [FakeConfig(4, XBLOCK=8, R0_BLOCK=128), FakeConfig(8, XBLOCK=1, R0_BLOCK=2048),
            FakeConfig(2, XBLOCK=64, R0_BLOCK=64)]


def plant(cache: TuneCache, filename: str, m: dict[str, Any], entry: dict[str, Any],
          cfgs: list[FakeConfig]) -> None:
    """Store ``entry`` as the best config of the kernel in ``filename``, as a hostile or
    broken peer could (any JSON object under the kernel's key)."""
    from tunecache.keys import canonical_json

    created = ac.AutotuneCache.create(m, filename, th.hash_configs(cfgs))
    key = tc_inductor.triton_key(created.remote_cache_full_key,
                                 json.loads(created.remote_cache[1]))
    claim = cache.claim(key, wait=0.0)
    value = {"configs_hash": created.configs_hash, **entry}
    assert cache.publish(claim, {canonical_json(value): 1.0}) is not None


def warning_lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tunecache" and r.levelno >= logging.WARNING]


# Not one of the kernel's own configs, so Inductor rebuilds it from the entry (as it
# does a coordinate-descent result) rather than pick its own matching config.
FINE_CONFIG = {"num_warps": 4, "num_stages": 1, "XBLOCK": 16, "R0_BLOCK": 128}


# A valid config, not one of the kernel's own: a coordinate-descent result, as stored
# for a kernel that coordinate descent tunes. Every torch loads such a one (2.11 and 2.12
# load no other config outside the kernel's own list; 2.13 rebuilds any).
STORED_CONFIG = {"num_warps": 16, "num_stages": 1, "XBLOCK": 1024, "found_by_coordesc": True}


def broken_kernels(broken: Any, tmp_path: Path, n: int = 2, first: int = 0) -> list[Any]:
    """``n`` kernels loaded with STORED_CONFIG stored for each (a hit each)."""
    kernels = []
    for i in range(first, first + n):
        body = f"tmp0 + {i}"
        plant(broken.cache, kernel_file(tmp_path, 0, body=body), meta(coordesc=True),
              STORED_CONFIG, configs())
        k = broken.fa.load_autotuner(kernel_file(tmp_path, 1, body=body), meta(coordesc=True),
                                     configs())
        assert k.autotune_cache_info["autotune_cache_state"] == "hit"
        kernels.append(k)
    return kernels


def run_rank(db: str, tmp: Path, index: int, role: str) -> dict[str, Any]:
    env = rank_env()
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / f"inductor-{index}")
    out = subprocess.run(
        [sys.executable, str(RANK_WORKER), role, db, str(tmp), str(index)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def coordesc_proc(tmp: Path, index: int, *, kernels: int, tune_seconds: float,
                   barrier: bool, lease: float = 2.0) -> subprocess.Popen[str]:
    # The short default lease: a killed or stopped rank's claim expires soon.
    env = rank_env()
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / f"inductor-{index}")
    return subprocess.Popen(
        [sys.executable, str(RANK_WORKER), "coordesc", str(tmp / "tune.db"), str(tmp),
         str(index), str(kernels), str(tune_seconds), "barrier" if barrier else "alone",
         str(lease)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rank_result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def wait_for(path: Path, seconds: float = 120) -> None:
    procs.wait_until(path.exists, f"{path} appearing", seconds)
