"""tunecache.inductor's Triton section: Inductor's remote autotune cache over tunecache.

Triton is not installed on the CPU test machines, but Inductor's autotune-cache code is
pure Python: these tests drive Inductor's own ``check_autotune_cache`` ->
``AutotuneCache.create`` -> ``read_best`` and ``AutotuneCache.save`` (the calls a kernel
load and its first run make, torch/_inductor/runtime/triton_heuristics.py) with fake
configs and generated-looking kernel files. The two-process test runs this file as a
script (see the bottom) so that each "rank" is its own process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import procs  # noqa: E402
from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor import remote_cache as rc  # noqa: E402
from torch._inductor.runtime import autotune_cache as ac  # noqa: E402
from torch._inductor.runtime import triton_heuristics as th  # noqa: E402
from triton_fakes import (  # noqa: E402
    FakeConfig,
    FakeKernel,
    FakeLauncher,
    TritonConfig,
    benchmark_harness,
    configs,
    kernel_file,
    kernel_source,
    meta,
)

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402
from tunecache.core import TuneCache  # noqa: E402
from tunecache.inductor.state import REGISTRY  # noqa: E402
from tunecache.inductor.triton import coordesc as tc_coordesc  # noqa: E402
from tunecache.inductor.triton.remote import TritonCache  # noqa: E402
from tunecache.inductor.triton.worker import EnvCache  # noqa: E402
from tunecache.store.claims import Claim  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def enabled(tmp_path, monkeypatch):
    """tunecache enabled on a fresh SQLite file; yields the TuneCache."""
    cache = tunecache.open(str(tmp_path / "tune.db"), triton_configs=True)
    assert tc_inductor.enable(cache)
    tc_inductor.triton_stats.reset()
    try:
        yield cache
    finally:
        tc_inductor.disable()
        cache.close()


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


# ------------------------------------------------------- the core API this relies on


def test_core_claim_publish_take_over_and_wait(db_url):

    db = db_url
    key = {"kind": "triton_config", "op": "k", "kernel": "x"}
    with tunecache.open(db) as a, tunecache.open(db) as b:
        live = {**key, "kernel": "live"}
        assert isinstance(a.claim(live, lease_seconds=600), Claim)
        assert b.claim(live, wait=0.0) is None  # a live claim, and we would not wait
        first = a.claim(key, lease_seconds=0.5)
        assert first is not None and not isinstance(first, tunecache.Result)
        # Waits for the lease to pass (the wait only bounds a hang), then takes over.
        second = b.claim(key, wait=60.0)
        assert second is not None and not isinstance(second, tunecache.Result)
        assert a.publish(first, {"late": 1.0}) is None  # fenced off
        assert b.publish(second, {"won": 2.0}).source == "tuned"
        hit = a.claim(key)
        assert hit.source == "hit" and hit.timings == {"won": 2.0}

        other = {**key, "kernel": "y"}
        claim = a.claim(other, lease_seconds=30)
        peer = _publish_while_waiting(b, lambda: a.publish(claim, {"c": 3.0}))
        waited = b.claim(other, wait=60.0)
        peer.join(60)
        assert waited.source == "peer" and waited.timings == {"c": 3.0}
    with tunecache.open(db, mode="readonly") as ro:
        assert ro.claim({**key, "kernel": "z"}) is None
        assert ro.claim(key).source == "hit"


def test_a_claim_given_back_unneeded_is_not_a_failed_attempt(db_url):
    # A measurement stopped because the search will not ask for it: were it an attempt,
    # the key would end failed after max_attempts, and every rank then measures it alone.
    key = {"kind": "fusion_benchmark", "op": "k", "kernel": "x"}
    with tunecache.open(db_url) as a, tunecache.open(db_url) as b:
        for _ in range(a.settings.max_attempts + 1):
            claim = b.claim(key, wait=0.0)
            assert isinstance(claim, Claim)
            b.release(claim, "_NoLongerWanted: ", failed=False)
        a.release(a.claim(key, wait=0.0), "RuntimeError: boom")  # a real failure counts
        assert isinstance(b.claim(key, wait=0.0), Claim)
        assert b.lookup(key) is None


# --------------------------------------------------------------------------- enable


def test_enable_plugs_in_and_disable_restores(tmp_path):
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner
    from torch._inductor.scheduler import Scheduler

    before = (rc.RemoteAutotuneCache, inductor_config.autotune_remote_cache,
              inductor_config.compile_threads, ac.AutotuneCache.__dict__["create"])
    # Inductor's own methods that the runtime hooks wrap (this torch's real ones).
    hooked = [(th.CachingAutotuner, "coordinate_descent_tuning"),
              (th.CachingAutotuner, "autotune_to_one_config"),
              (th.CachingAutotuner, "_dynamic_scale_rblock"),
              (th.CachingAutotuner, "precompile"), (ac.AutotuneCache, "read_best"),
              (CoordescTuner, "autotune_single_field"),
              (CoordescTuner, "call_func"),
              (TritonScheduling, "benchmark_codegened_module"),
              (Scheduler, "compile_kernel"), (AsyncCompile, "triton")]
    own = [owner.__dict__[name] for owner, name in hooked]
    cache = tunecache.open(str(tmp_path / "tune.db"), triton_configs=True)
    assert tc_inductor.enable(cache)
    try:
        assert all(owner.__dict__[name] is not orig
                   for (owner, name), orig in zip(hooked, own))
        assert rc.RemoteAutotuneCache is not before[0]
        assert rc.RemoteAutotuneCache.__name__ == "TuneCacheAutotuneCache"
        assert inductor_config.autotune_remote_cache is True
        assert inductor_config.compile_threads == 1
        # Inductor's create_cache finds our class by name, as it finds the Redis one.
        assert type(rc.create_cache("x", False, "FbRemoteAutotuneCache",
                                    "RemoteAutotuneCache")) is rc.RemoteAutotuneCache
    finally:
        tc_inductor.disable()
        cache.close()
    after = (rc.RemoteAutotuneCache, inductor_config.autotune_remote_cache,
             inductor_config.compile_threads, ac.AutotuneCache.__dict__["create"])
    assert after == before
    assert [owner.__dict__[name] for owner, name in hooked] == own


def test_count_only_leaves_triton_alone():
    before = rc.RemoteAutotuneCache
    assert tc_inductor.enable(count_only=True)
    try:
        assert rc.RemoteAutotuneCache is before
    finally:
        tc_inductor.disable()


# ----------------------------------------------------------------------------- keys


def test_key_ignores_the_device_index_only(enabled, tmp_path):
    k0 = create(kernel_file(tmp_path, 0), meta()).remote_cache[1]
    k1 = create(kernel_file(tmp_path, 1), meta()).remote_cache[1]
    other = create(kernel_file(tmp_path, 0, body="tmp0 * tmp1"), meta()).remote_cache[1]
    # Inductor numbers kernels per graph: the same kernel renumbered is the same key.
    renumbered = Path(kernel_file(tmp_path, 2))
    renumbered.write_text(renumbered.read_text().replace("fused_add_0", "fused_add_7"))
    k7 = create(str(renumbered), meta()).remote_cache[1]
    assert k0 == k1
    assert json.loads(k7)["name"] == "triton_poi_fused_add_7"
    key7, key0 = (tc_inductor.triton_key("i", json.loads(k)) for k in (k7, k0))
    assert key7 == key0
    assert other != k0
    info = json.loads(k0)
    assert info["heuristic"] == "pointwise" and info["device_type"] == "cuda"
    key = tc_inductor.triton_key("inductor-key", info)
    assert key["kind"] == "triton_config" and key["op"] == "triton_poi_fused_add"
    assert "torch" in key["env"] and "triton" in key["env"]
    # The device as the source describes it: compile workers must not initialise CUDA.
    assert key["env"]["device"] == "cuda cc=90 sms=132"
    assert "index" not in json.dumps(key)


def test_benchmark_harness_device_index_is_not_in_the_key(enabled, tmp_path):
    # Kernel modules Inductor benchmarks for fusion decisions name their GPU in the
    # harness too: ranks must still share them.
    k0, k1 = (create(kernel_file(tmp_path, i, tail=benchmark_harness(i)), meta())
              .remote_cache[1] for i in (0, 1))
    bigger = create(kernel_file(tmp_path, 0, tail=benchmark_harness(0, size=2048)),
                    meta()).remote_cache[1]
    assert k0 == k1
    assert bigger != k0  # the shapes in the harness stay in


# -------------------------------------------------------------------- get, claim, put


def test_miss_is_tuned_here_and_its_save_publishes_for_the_next_load(enabled, tmp_path):
    filename = kernel_file(tmp_path, 0)
    cfgs, cache, info = load(filename, meta())
    assert info["autotune_cache_state"] == "miss" and len(cfgs) == 3
    assert stored(enabled) == []  # a load only reads
    cache.save(cfgs[1], 7_000_000)  # what autotune_to_one_config does
    rows = stored(enabled)
    assert [(r["kind"], r["state"]) for r in rows] == [("triton_config", "done")]

    cfgs, _, info = load(kernel_file(tmp_path, 3), meta())  # another GPU index
    assert info["autotune_cache_state"] == "hit"
    assert (cfgs[0].kwargs, cfgs[0].num_warps) == ({"XBLOCK": 512}, 8)
    s = tc_inductor.triton_stats.as_dict()
    assert (s["lookups"], s["misses"], s["hits"], s["puts"], s["published"]) == (2, 1, 1, 1, 1)


def test_coordinate_descent_result_replaces_the_first_save(enabled, tmp_path):
    m = meta(coordesc=True)
    cfgs, cache, _ = load(kernel_file(tmp_path, 0), m)
    # autotune_to_one_config saves its winner (with the launcher's cache hash) ...
    cache.save(cfgs[0], 3_000_000, found_by_coordesc=True, triton_cache_hash="abc")
    assert stored(enabled) == []  # held back
    # ... then coordinate descent saves the final config (triton_heuristics, 2.11-2.14).
    cache.save(FakeConfig(16, num_stages=2, XBLOCK=1024), 9_000_000, found_by_coordesc=True)
    (row,) = stored(enabled)
    assert row["state"] == "done"
    (name,) = json.loads(row["timings_json"])
    best = json.loads(name)
    assert (best["XBLOCK"], best["num_warps"], best["found_by_coordesc"]) == (1024, 16, True)
    assert tc_inductor.triton_stats.published == 1


def test_held_first_save_is_published_when_the_thread_moves_on(enabled, tmp_path):
    # A kernel that coordinate descent skips (deterministic reductions) saves only once.
    m = meta(coordesc=True)
    cfgs, cache, _ = load(kernel_file(tmp_path, 0), m)
    cache.save(cfgs[2], 1_000_000, found_by_coordesc=True, triton_cache_hash="abc")
    assert stored(enabled) == []
    load(kernel_file(tmp_path, 0, body="other"), m)  # the next kernel
    assert [r["state"] for r in stored(enabled)] == ["done"]


def test_template_kernel_save_is_published_without_waiting_for_coordinate_descent(
    enabled, tmp_path
):
    # One fixed config and no coordinate descent: there is no second save to hold for.
    cfgs, cache, info = load(kernel_file(tmp_path, 0, heuristic="template"), meta(True))
    assert info["autotune_cache_state"] == "miss" and cache is not None
    cache.save(cfgs[0], 1_000_000, found_by_coordesc=True, triton_cache_hash="abc")
    assert [r["state"] for r in stored(enabled)] == ["done"]


def test_hostile_entry_is_ignored(enabled, tmp_path):
    cache = create(kernel_file(tmp_path, 0), meta())
    key = tc_inductor.triton_key(cache.remote_cache_full_key, json.loads(cache.remote_cache[1]))
    claim = enabled.claim(key)
    evil = {"num_warps": 3, "num_stages": 1, "configs_hash": cache.configs_hash, "XBLOCK": 7}
    assert enabled.publish(claim, {json.dumps(evil): 0.0}) is not None

    cfgs, _, state = load(kernel_file(tmp_path, 1), meta())
    assert state["autotune_cache_state"] == "miss" and len(cfgs) == 3
    s = tc_inductor.triton_stats.as_dict()
    assert s["invalid"] == 1 and s["hits"] == 0


@pytest.mark.parametrize("bad", [
    {},
    {"a": 1.0, "b": 2.0},
    {"not json": 0.0},
    {json.dumps([1, 2]): 0.0},
    {json.dumps({"num_warps": 4, "num_stages": 1}): 0.0},  # no configs_hash
    {json.dumps({"num_warps": True, "num_stages": 1, "configs_hash": "h"}): 0.0},
    {json.dumps({"num_warps": 4, "num_stages": 99, "configs_hash": "h"}): 0.0},
    {json.dumps({"num_warps": 4, "num_stages": 1, "configs_hash": "h", "R0_BLOCK": 0}): 0.0},
    {json.dumps({"num_warps": 4, "num_stages": 1, "configs_hash": "h", "X": [1]}): 0.0},
])
def test_entry_validation(bad):
    assert tc_inductor.triton_config_from_entry(bad) is None


def test_loads_never_wait_for_a_peers_claim_and_the_first_publish_wins(enabled, tmp_path):
    created = create(kernel_file(tmp_path, 0), meta(name="k_peer"))
    key = tc_inductor.triton_key(created.remote_cache_full_key,
                                 json.loads(created.remote_cache[1]))
    peer = tunecache.open(enabled.settings.db_url)
    try:
        # A peer is about to publish this kernel (claimed, lease far from over).
        claim = peer.claim(key, lease_seconds=600)
        assert not isinstance(claim, tunecache.Result)
        t0 = time.monotonic()
        cfgs, cache, info = load(kernel_file(tmp_path, 1), meta(name="k_peer"))
        assert time.monotonic() - t0 < 30  # no wait for the peer (its lease is 600 s)
        assert info["autotune_cache_state"] == "miss"
        cache.save(cfgs[0], 1_000_000)  # our own tuning: not stored over the peer's claim
        assert tc_inductor.triton_stats.unpublished == 1
        assert [r["state"] for r in stored(enabled)] == ["claimed"]
        peer_best = {"num_warps": 8, "num_stages": 1, "configs_hash": created.configs_hash,
                     "XBLOCK": 512}
        assert peer.publish(claim, {json.dumps(peer_best): 2.0}) is not None
        cfgs, _, info = load(kernel_file(tmp_path, 2), meta(name="k_peer"))
        assert info["autotune_cache_state"] == "hit"
        assert (cfgs[0].kwargs, cfgs[0].num_warps) == ({"XBLOCK": 512}, 8)
    finally:
        peer.close()


def test_compile_workers_read_the_shared_cache_and_the_kernel_carries_it_back(
    tmp_path, monkeypatch
):
    """A real Inductor compile worker (SubprocPool) loads the kernel: with tunecache
    activated from the environment, our entry point plugs the cache in there too, so
    Inductor's parallel compile stays on."""
    import triton_fakes
    from torch._inductor.compile_worker.subproc_pool import SubprocPool

    db = str(tmp_path / "tune.db")
    with tunecache.open(db) as made:  # the compiling process's first GEMM lookup made it
        assert made.lookup({"kind": "gemm", "op": "none"}) is None
    monkeypatch.setenv("TUNECACHE_DB", db)
    monkeypatch.setenv("TUNECACHE_TRITON_CONFIGS", "1")
    monkeypatch.delenv("TUNECACHE_MODE", raising=False)
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    threads = inductor_config.compile_threads
    assert threads > 1
    assert tc_inductor.enable()  # from the environment, as the entry point does
    tc_inductor.triton_stats.reset()
    pool = SubprocPool(1)
    try:
        assert inductor_config.compile_threads == threads
        first = pool.submit(triton_fakes.load_kernel, kernel_file(tmp_path, 0), meta())
        first = first.result(timeout=120)
        assert first["remote_class"] == "TuneCacheAutotuneCache"
        assert first["state"] == "miss" and len(first["configs"]) == 3
        # The AutotuneCache built in the worker came back pickled; the kernel's first
        # run saves through it here, in the compiling process.
        first["autotune_cache"].save(first["configs"][1], 7_000_000)
        assert tc_inductor.triton_stats.published == 1
        again = pool.submit(triton_fakes.load_kernel, kernel_file(tmp_path, 1), meta())
        again = again.result(timeout=120)
        assert again["state"] == "hit"
        assert [(c.kwargs, c.num_warps) for c in again["configs"]] == [({"XBLOCK": 512}, 8)]
    finally:
        pool.shutdown()
        tc_inductor.disable()
    assert inductor_config.compile_threads == threads


# ------------------------------------- coordinate descent: adopted, claimed or deferred

TUNED = FakeConfig(16, XBLOCK=1024)  # what the fake coordinate descent "finds"


def _tuning_inductors_own(tuned: list[Any], fail: list[bool]):
    def coordinate_descent_tuning(self, launcher, *args, **kwargs):  # Inductor's, faked
        tuned.append(launcher)
        if fail:
            raise RuntimeError("benchmark failed")
        best = TritonConfig(dict(TUNED.kwargs), TUNED.num_warps, TUNED.num_stages)
        self.save_cache_hook(best, 9_000_000, found_by_coordesc=True)
        best.found_by_coordesc = True
        return FakeLauncher(best)

    return coordinate_descent_tuning


@pytest.fixture
def coordesc(tmp_path, monkeypatch):
    """tunecache enabled over a faked Inductor coordinate descent (recorded in .tuned)."""
    tuned: list[Any] = []
    fail: list[bool] = []  # append to make the next tunings raise
    benchmarked: list[Any] = []  # kernels whose max-autotune configs were benchmarked
    inductors_own = _tuning_inductors_own(tuned, fail)
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
    cache = tunecache.open(db, triton_configs=True)
    peer = tunecache.open(db, triton_configs=True)  # another rank: its own claim owner
    assert tc_inductor.enable(cache)
    # In place at enable(), not at the first kernel load in this process: with parallel
    # compile that can come after the forward graph's first run.
    assert th.CachingAutotuner.coordinate_descent_tuning is not inductors_own
    tc_inductor.triton_stats.reset()

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
        tc_inductor.disable()
        cache.close()
        peer.close()
    assert th.CachingAutotuner.coordinate_descent_tuning is inductors_own
    assert th.CachingAutotuner.autotune_to_one_config is autotune_to_one_config


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


def test_worker_hit_skips_coordinate_descent_in_the_compiling_process(coordesc):
    # A hit read in a compile worker comes back with a triton.Config whose
    # found_by_coordesc mark was dropped by unpickling (triton.Config.__setstate__):
    # Inductor would run coordinate descent again at the first run.
    k, launcher, _ = coordesc.kernel(0)
    assert first_run(k, launcher).config.kwargs == TUNED.kwargs  # tuned and published
    assert coordesc.tuned == [launcher]

    k, _, _ = coordesc.kernel(1)  # the worker's load on another GPU: a hit
    assert k.autotune_cache_info["autotune_cache_state"] == "hit"
    unpickled = FakeLauncher(FakeConfig(16, XBLOCK=1024))  # the stored config, no mark
    assert first_run(k, unpickled) is unpickled
    assert unpickled.config.found_by_coordesc is True
    assert tc_inductor.triton_stats.coordesc_restored == 1
    assert coordesc.tuned == [launcher] and k.compiled == []


def test_a_kernel_a_peer_tuned_first_adopts_its_config_without_tuning(coordesc):
    k, launcher, key = coordesc.kernel(0)  # loaded (a miss) before the peer published
    claim = coordesc.peer.claim(key)
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256))
    adopted = first_run(k, launcher)
    assert (adopted.config.kwargs, adopted.config.num_warps) == ({"XBLOCK": 256}, 8)
    assert adopted.config.found_by_coordesc is True and k.compiled == [adopted.config]
    assert coordesc.tuned == [] and tc_inductor.triton_stats.adopted == 1


def test_a_kernel_a_peer_is_tuning_runs_untuned_until_the_peers_result_is_in(
        coordesc, monkeypatch):
    monkeypatch.setattr(tc_coordesc, "DEFERRED_CHECK_SECONDS", 0.05)
    # The check interval runs on a clock this test moves, so "0.05 s later" holds on a
    # loaded machine too (the lease and the database keep real time).
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(tc_coordesc, "time", SimpleNamespace(monotonic=lambda: clock.now))
    k, launcher, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key)
    assert first_run(k, launcher) is launcher  # launched with autotune_to_one_config's pick
    assert not getattr(launcher.config, "found_by_coordesc", False)  # run() comes back
    assert k._cache_eligible is False  # and 2.13's fast path does not skip that
    clock.now += 0.06
    assert first_run(k, launcher) is launcher  # the peer is still tuning: no waiting
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256))
    clock.now += 0.04
    assert first_run(k, launcher) is launcher  # looked 0.04 s ago: not again yet
    clock.now += 0.02
    adopted = first_run(k, launcher)
    assert adopted.config.kwargs == {"XBLOCK": 256} and adopted.config.found_by_coordesc
    assert k._cache_eligible is True and coordesc.tuned == []
    stats = tc_inductor.triton_stats
    assert (stats.deferred, stats.adopted, stats.peer_wait_seconds) == (1, 1, 0.0)


def test_disable_gives_a_deferred_kernel_its_launcher_fast_path_back(coordesc):
    k, launcher, key = coordesc.kernel(0)
    coordesc.peer.claim(key)
    assert first_run(k, launcher) is launcher and k._cache_eligible is False  # deferred
    tc_inductor.disable()
    assert k._cache_eligible is True and "_tunecache_deferred" not in vars(k)


def test_inside_a_fusion_benchmark_a_peers_kernel_is_waited_for(coordesc, monkeypatch):
    # The benchmark times whatever config runs, so running it untuned would decide the
    # fusion on the wrong timing.
    monkeypatch.setattr(REGISTRY.fusion_local, "benchmarking", True, raising=False)
    adopted = _first_run_while_the_peer_tunes(coordesc)
    assert adopted.config.kwargs == {"XBLOCK": 256} and adopted.config.found_by_coordesc
    assert tc_inductor.triton_stats.deferred == 0 and coordesc.tuned == []
    assert tc_inductor.triton_stats.peer_wait_seconds > 0


def _publish_while_waiting(cache: TuneCache, publish: Callable[[], object],
                           reads: int = 2) -> threading.Thread:
    """Run a peer's ``publish`` once this thread has read the key ``reads`` times through
    ``cache``: it has seen the peer's claim and is waiting on it. (A timer could fire
    before the wait began on a loaded machine, and the key would be a plain hit.)"""
    waiting = procs.after_reads(cache, reads)
    thread = threading.Thread(target=lambda: waiting.wait(120) and publish(), daemon=True)
    thread.start()
    return thread


def _first_run_while_the_peer_tunes(coordesc: Any) -> Any:
    """A kernel's first run while the peer holds its claim and publishes during its wait."""
    k, launcher, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key)
    # Three reads: the lookup, the claim's, and one while waiting.
    peer = _publish_while_waiting(coordesc.cache, lambda: publish_as_peer(
        coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256)), reads=3)
    try:
        return first_run(k, launcher)
    finally:
        peer.join(60)


def _one_config(kernel: Any) -> Any:
    """What CachingAutotuner.run does first with a kernel of several configs."""
    kernel.launchers = [FakeLauncher(c) for c in configs()]
    th.CachingAutotuner.autotune_to_one_config(kernel)
    assert "benchmark_all_configs" not in kernel.__dict__  # the method is Inductor's again
    (launcher,) = kernel.launchers
    return launcher


def test_a_kernel_a_peer_is_tuning_is_not_benchmarked_here(coordesc):
    k, _, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key)
    launcher = _one_config(k)  # the first config, not benchmarked
    assert launcher.config.kwargs == configs()[0].kwargs and coordesc.benchmarked == []
    assert first_run(k, launcher) is launcher  # deferred: runs it until the peer's is in
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256))
    assert tc_inductor.triton_stats.configs_benchmark_skipped == 1


@pytest.mark.parametrize("run", [_one_config, lambda k: first_run(k, FakeLauncher(configs()[0]))],
                         ids=["configs benchmark", "coordinate descent"])
def test_a_kernel_its_peer_publishes_as_this_rank_claims_it_is_adopted_not_measured(
        coordesc, monkeypatch, run):
    # Ranks in step reach a kernel just as the peer that claimed it publishes it: the
    # claim finds the peer's claim, then the peer publishes, before this rank reads the
    # key again (this made a two-process test flaky before the claim looked again).
    k, _, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key)
    claims = coordesc.cache.claim

    def claim_then_the_peer_publishes(*args, **kwargs):
        answer = claims(*args, **kwargs)
        if answer is None and coordesc.peer.lookup(key) is None:
            publish_as_peer(coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256))
        return answer

    monkeypatch.setattr(coordesc.cache, "claim", claim_then_the_peer_publishes)
    launcher = run(k)
    assert coordesc.benchmarked == [] and coordesc.tuned == []
    adopted = first_run(k, launcher)
    assert adopted.config.kwargs == {"XBLOCK": 256} and adopted.config.found_by_coordesc


def test_a_free_kernel_is_benchmarked_before_coordinate_descent(coordesc):
    k, _, _ = coordesc.kernel(0)
    launcher = _one_config(k)
    assert launcher.config.kwargs == configs()[-1].kwargs  # the fake benchmark's winner
    assert coordesc.benchmarked == [k]
    assert first_run(k, launcher).config.kwargs == TUNED.kwargs
    assert tc_inductor.triton_stats.configs_benchmark_skipped == 0


def test_a_free_kernel_is_claimed_before_its_configs_are_benchmarked(coordesc):
    # A peer reaching the kernel during that benchmark leaves both it and the coordinate
    # descent to this rank.
    k, _, key = coordesc.kernel(0)
    launcher = _one_config(k)
    assert coordesc.peer.claim(key, wait=0.0) is None  # held: the peer would skip it
    assert first_run(k, launcher).config.kwargs == TUNED.kwargs  # under that claim
    assert coordesc.tuned == [launcher] and tc_inductor.triton_stats.published == 1


def test_a_claim_taken_for_a_configs_benchmark_is_given_back_if_no_tuning_follows(
        coordesc):
    k, _, key = coordesc.kernel(0)
    _one_config(k)
    other, _, _ = coordesc.kernel(0, body="tmp0 * tmp1")
    _one_config(other)  # this thread went on to another kernel without tuning the first
    assert isinstance(coordesc.peer.claim(key, wait=0.0), Claim)


def test_a_failed_configs_benchmark_gives_the_key_back_at_once(coordesc):
    coordesc.fail.append(True)
    k, _, key = coordesc.kernel(0)
    with pytest.raises(RuntimeError, match="benchmark failed"):
        _one_config(k)
    assert isinstance(coordesc.peer.claim(key, wait=0.0), Claim)


def test_under_cuda_graph_trees_a_peers_kernel_is_waited_for_not_deferred(
        coordesc, monkeypatch):
    monkeypatch.setattr(tc_coordesc, "_cuda_graph_trees_in_use", lambda kernel: True)
    adopted = _first_run_while_the_peer_tunes(coordesc)
    assert adopted.config.kwargs == {"XBLOCK": 256} and adopted.config.found_by_coordesc
    assert tc_inductor.triton_stats.deferred == 0 and coordesc.tuned == []


def test_a_deferred_kernel_recorded_in_a_cuda_graph_keeps_its_first_config(
        coordesc, monkeypatch):
    k, launcher, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key)
    assert first_run(k, launcher) is launcher  # deferred
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256))
    monkeypatch.setattr(tc_coordesc, "_capturing", lambda: True)
    assert first_run(k, launcher) is launcher  # no compile while capturing
    assert launcher.config.found_by_coordesc is True and k.compiled == []
    assert k._cache_eligible is True and tc_inductor.triton_stats.kept_untuned == 1


def test_a_free_kernel_is_claimed_tuned_and_published_for_the_peers(coordesc):
    k, launcher, key = coordesc.kernel(0)
    assert first_run(k, launcher).config.found_by_coordesc
    assert coordesc.tuned == [launcher]
    stored = coordesc.peer.lookup(key)
    assert stored is not None and json.loads(stored.best)["XBLOCK"] == 1024
    assert json.loads(stored.best)["found_by_coordesc"] is True
    assert tc_inductor.triton_stats.published == 1


def test_a_failed_tuning_gives_the_key_back_at_once(coordesc):
    coordesc.fail.append(True)
    k, launcher, key = coordesc.kernel(0)
    with pytest.raises(RuntimeError, match="benchmark failed"):
        first_run(k, launcher)
    assert isinstance(coordesc.peer.claim(key, wait=0.0), Claim)  # no lease to wait out


def test_a_peer_that_never_publishes_is_taken_over_after_its_lease(coordesc, monkeypatch):
    monkeypatch.setattr(tc_coordesc, "DEFERRED_CHECK_SECONDS", 0.0)  # every run looks
    k, launcher, key = coordesc.kernel(0)
    # Never published. The first run follows at once: 2 s is a wide margin for it.
    claim = coordesc.peer.claim(key, lease_seconds=2.0)
    launcher = first_run(k, launcher)
    assert not getattr(launcher.config, "found_by_coordesc", False)  # the lease is live
    assert coordesc.tuned == [] and tc_inductor.triton_stats.deferred == 1
    row = lambda: coordesc.peer.store.read([claim.key_hash])[claim.key_hash]  # noqa: E731
    procs.wait_until(lambda: row().lease_expired, "the peer's lease passing")
    launcher = first_run(k, launcher)  # the next run takes the key over and tunes it
    assert launcher.config.found_by_coordesc and row().token == 2
    assert launcher.config.kwargs == TUNED.kwargs and len(coordesc.tuned) == 1
    assert json.loads(coordesc.peer.lookup(key).best)["XBLOCK"] == 1024


def test_a_hit_keeps_its_stored_reduction_config(tmp_path, monkeypatch):
    # 2.11 re-expands a register-heavy reduction config with smaller R0_BLOCKs at every
    # precompile, a stored hit's included, and benchmarks the variants: a warm job tuned.
    expanded: list[Any] = []

    def inductors_own_2_11(self):  # no check for a cache hit
        expanded.append(self)

    monkeypatch.setattr(th.CachingAutotuner, "_dynamic_scale_rblock", inductors_own_2_11)
    cache = tunecache.open(str(tmp_path / "tune.db"), triton_configs=True)
    assert tc_inductor.enable(cache)
    try:
        hit = SimpleNamespace(autotune_cache_info={"autotune_cache_state": "hit"})
        miss = SimpleNamespace(autotune_cache_info={"autotune_cache_state": "miss"})
        th.CachingAutotuner._dynamic_scale_rblock(hit)
        th.CachingAutotuner._dynamic_scale_rblock(miss)
        assert expanded == [miss]
    finally:
        tc_inductor.disable()
        cache.close()
    assert th.CachingAutotuner._dynamic_scale_rblock is inductors_own_2_11


# ------------------------------------------------------------------ fusion benchmarks

# What CoordescTuner.call_func needs of its tuner, with nothing cached.
_CACHELESS_TUNER = SimpleNamespace(lookup_in_cache=lambda config: None,
                                   cache_benchmark_result=lambda config, timing: None)


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
            CoordescTuner.call_func(_CACHELESS_TUNER, lambda _: time.sleep(timing.seconds),
                                    step)
            if step == 0 and timing.after_first_step is not None:
                timing.after_first_step(mod.__file__)
        ms = timing.ms(mod.__file__) if callable(timing.ms) else timing.ms
        completed.append(mod.__file__)
        return ms, mod.__file__

    monkeypatch.setattr(TritonScheduling, "benchmark_codegened_module", inductors_own)
    db = str(tmp_path / "tune.db")
    cache = tunecache.open(db, triton_configs=True)
    peer = tunecache.open(db, triton_configs=True)
    assert tc_inductor.enable(cache)
    tc_inductor.triton_stats.reset()

    def benchmark(index: int, size: int = 1024) -> Any:
        """Rank ``index`` times the module Inductor wrote for one fusion candidate."""
        mod = SimpleNamespace(__file__=kernel_file(tmp_path, index,
                                                   tail=benchmark_harness(index, size)))
        return TritonScheduling.benchmark_codegened_module(object(), mod, 8)

    try:
        yield SimpleNamespace(benchmark=benchmark, measured=measured, completed=completed,
                              timing=timing, peer=peer, cache=cache)
    finally:
        tc_inductor.disable()
        cache.close()
        peer.close()
    assert TritonScheduling.benchmark_codegened_module is inductors_own


def test_a_fusion_benchmark_is_measured_once_and_read_by_every_later_rank(fusion):
    ms, path = fusion.benchmark(0)
    assert ms == 0.25 and path.endswith("kernel.py") and len(fusion.measured) == 1
    fusion.timing.ms = 9.0  # a second measurement would differ
    assert fusion.benchmark(1)[0] == 0.25  # another GPU: the stored timing, not run
    assert len(fusion.measured) == 1
    assert fusion.benchmark(0, size=2048)[0] == 9.0  # another module is measured
    stats = tc_inductor.triton_stats.as_dict()
    assert (stats["fusion_hits"], stats["fusion_measured"]) == (1, 2)
    kinds = {r["kind"] for r in stored(fusion.cache)}
    assert kinds == {"fusion_benchmark"}


def _fusion_key(size: int = 1024) -> dict[str, Any]:
    """The key of the module ``fusion.benchmark(index, size)`` times, on any rank."""
    return tc_inductor.fusion_benchmark_key(
        kernel_source(0, tail=benchmark_harness(0, size)), 8)


def test_a_fusion_benchmark_a_peer_is_running_is_waited_for_not_run(fusion):
    claim = fusion.peer.claim(_fusion_key())  # rank 1 is measuring it
    # Three reads: the lookup, the claim's, and one while waiting.
    peer = _publish_while_waiting(fusion.cache,
                                  lambda: fusion.peer.publish(claim, {"ms": 0.125}), reads=3)
    ms, _ = fusion.benchmark(0)
    peer.join(60)
    assert ms == 0.125 and fusion.measured == []  # the peer's timing decides, here too
    assert tc_inductor.triton_stats.peer_wait_seconds > 0


def test_a_fusion_benchmark_that_raises_gives_its_key_back_at_once(fusion):

    def broken(_file: str) -> float:
        raise RuntimeError("no valid triton configs")

    fusion.timing.ms = broken
    with pytest.raises(RuntimeError, match="no valid triton configs"):
        fusion.benchmark(0)
    assert isinstance(fusion.peer.claim(_fusion_key(), wait=0.0), Claim)  # no lease to wait


def test_a_negative_fusion_timing_is_shared_as_zero(fusion):
    # Inductor subtracts the cost of cloning mutated inputs, which can exceed the run.
    fusion.timing.ms = -0.01
    assert fusion.benchmark(0)[0] == 0.0
    assert fusion.benchmark(1)[0] == 0.0 and len(fusion.measured) == 1


def _split_size_search(benchmark: Any, index: int) -> int:
    """Inductor's split-size search of a mix-order reduction (codegen/simd.py): each
    candidate value is its own module, benchmarked through benchmark_codegened_module."""
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

    return CoordescTuner.autotune_single_field(
        lambda value: benchmark(index, value)[0], 16, 8)


def _size(file: str) -> int:
    """The split size a benchmark harness (:func:`benchmark_harness`) measures."""
    return int(re.search(r"rand_strided\(\((\d+),\)", Path(file).read_text()).group(1))


def _timing_by_size(file: str, best: int = 32) -> float:
    """A parabola-like curve over the split size (the module's size)."""
    return 1.0 + abs(math.log2(_size(file)) - math.log2(best))


def test_the_split_size_search_leaves_a_value_a_peer_is_measuring_to_the_peer(fusion):
    fusion.timing.ms = _timing_by_size
    claim = fusion.peer.claim(_fusion_key(16))  # the peer measures the start value
    fusion.timing.after_first_step = _when_measuring(
        32, lambda: fusion.peer.publish(claim, {"ms": 2.0}))
    best = _split_size_search(fusion.benchmark, 0)
    # First round 8, 16, 32: 16 left to the peer; then 32's neighbour 64.
    assert _sizes(fusion.measured) == [8, 32, 64] and best == 32
    assert tc_inductor.triton_stats.fusion_left_to_peer == 1


@pytest.mark.parametrize("peers_ms, best", [(2.0, 32), (0.5, 64)])
def test_while_a_peer_measures_a_split_size_the_next_one_is_measured_here(
        fusion, peers_ms, best):
    # The search goes 8, 16, 32 (first round), then 64: the peer is measuring 64, so this
    # rank measures 128, which the search asks for next if 64 improves on 32.
    fusion.timing.ms = _timing_by_size
    claim = fusion.peer.claim(_fusion_key(64))
    # The peer's 64 comes in as this rank ends its measurement of 128.
    fusion.timing.after_first_step = _when_measuring(
        128, lambda: fusion.peer.publish(claim, {"ms": peers_ms}))
    assert _split_size_search(fusion.benchmark, 0) == best
    assert _sizes(fusion.completed) == [8, 16, 32, 128]  # 128 once, asked for or not
    assert tc_inductor.triton_stats.split_values_ahead == 1


def _sizes(files: list[str]) -> list[int]:
    return [_size(f) for f in files]


def _when_measuring(size: int, peer_publishes: Callable[[], Any]) -> Callable[[str], None]:
    """An after_first_step hook: the peer publishes while this rank measures ``size``."""
    def hook(file: str) -> None:
        if _sizes([file]) == [size]:
            peer_publishes()
    return hook


def test_a_split_size_measured_ahead_stops_once_the_search_will_not_ask_for_it(fusion):
    fusion.timing.ms = _timing_by_size
    claim = fusion.peer.claim(_fusion_key(64))
    # The kernel of each module takes 20 coordinate-descent benchmarks. The peer's 64
    # comes in after the first of 128's, no better than 32: the search ends at 32.
    fusion.timing.steps = 20
    fusion.timing.after_first_step = _when_measuring(
        128, lambda: fusion.peer.publish(claim, {"ms": 2.0}))
    assert _split_size_search(fusion.benchmark, 0) == 32
    assert _sizes(fusion.measured) == [8, 16, 32, 128]
    assert _sizes(fusion.completed) == [8, 16, 32]  # 128 was stopped
    stats = tc_inductor.triton_stats
    assert (stats.split_values_ahead, stats.split_values_stopped) == (0, 1)
    # Nothing stored for 128 (no inf from the stop), and its claim was given back, not
    # counted as a failed attempt.
    (given_back,) = [row for row in stored(fusion.cache) if row["state"] != "done"]
    assert (given_back["timings_json"], given_back["attempts"]) == (None, 0)
    assert isinstance(fusion.peer.claim(_fusion_key(128), wait=0.0), Claim)


def test_a_garbled_fusion_timing_is_measured_again(fusion):
    fusion.benchmark(0)
    key = tc_inductor.fusion_benchmark_key(Path(fusion.measured[0]).read_text(), 8)
    from sqlalchemy import update

    from tunecache.store.schema import entries

    fusion.cache.store.db.run(lambda c: c.execute(
        update(entries).values(timings_json='{"fastest": 0.0}')), write=True)
    assert fusion.peer.lookup(key) is not None  # valid timings, but not a fusion timing
    fusion.timing.ms = 0.5
    assert fusion.benchmark(1)[0] == 0.5 and len(fusion.measured) == 2


def test_entry_point_plugs_in_while_triton_heuristics_is_still_importing(tmp_path):
    # A compile worker: the first import is triton_heuristics, which imports
    # autotune_cache (the module our autoload hook watches) before CachingAutotuner exists.
    env = {**os.environ, "TUNECACHE_DB": str(tmp_path / "tune.db"),
           "TUNECACHE_TRITON_CONFIGS": "1"}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    probe = ("import torch\n"
             "from torch._inductor.runtime import triton_heuristics\n"
             "from torch._inductor import remote_cache\n"
             "from tunecache.inductor.state import REGISTRY\n"
             "print(remote_cache.RemoteAutotuneCache.__name__, REGISTRY.triton.worker)\n")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "not shared" not in out.stderr
    assert out.stdout.split() == ["TuneCacheAutotuneCache", "True"]


def test_worker_reopens_a_database_created_after_its_first_look(tmp_path, monkeypatch):
    db = tmp_path / "tune.db"
    monkeypatch.setenv("TUNECACHE_DB", str(db))
    monkeypatch.setattr(EnvCache, "RETRY_SECONDS", 0.0)
    env_cache = EnvCache()
    first = env_cache()
    assert first.lookup({"kind": "gemm", "op": "x"}) is None
    assert first.disabled_reason is not None and not db.exists()  # readonly: not created
    with tunecache.open(str(db)) as writer:
        assert writer.get_or_tune({"kind": "gemm", "op": "x"}, lambda: {"a": 1.0})
    second = env_cache()
    assert second is not first
    assert second.lookup({"kind": "gemm", "op": "x"}).timings == {"a": 1.0}
    assert env_cache() is second  # a working cache is kept
    second.close()


def test_worker_reads_hold_no_postgresql_connection(pg_url, monkeypatch):
    # Every rank has up to 32 compile workers; a server has ~100 connections.
    import psycopg

    monkeypatch.setenv("TUNECACHE_DB", pg_url)
    with tunecache.open(pg_url) as made:
        assert made.lookup({"kind": "gemm", "op": "none"}) is None  # schema in place
    env_cache = EnvCache()
    worker = TritonCache(env_cache, worker=True)
    info = json.dumps({"kernel": "k", "name": "triton_poi_fused_add_0", "device": "cuda"})
    for _ in range(3):
        assert worker.get("inductor-key", info) is None  # a miss, read through the store
    database = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, application_name="tunecache-test") as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND application_name = 'tunecache'", (database,)).fetchone()
    assert count == 0
    assert tc_inductor.triton_stats.errors == 0
    env_cache.close()


def test_compile_threads_drop_to_one_when_workers_cannot_read_the_cache(
    tmp_path, monkeypatch
):
    # Explicitly enabled on a database the environment does not name: the workers'
    # entry point would open another one (or none), so kernels load in this process.
    monkeypatch.setenv("TUNECACHE_DB", str(tmp_path / "other.db"))
    monkeypatch.setenv("TUNECACHE_TRITON_CONFIGS", "1")
    threads = inductor_config.compile_threads
    cache = tunecache.open(str(tmp_path / "tune.db"), triton_configs=True)
    assert tc_inductor.enable(cache)
    try:
        assert inductor_config.compile_threads == 1
    finally:
        tc_inductor.disable()
        cache.close()
    assert inductor_config.compile_threads == threads
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    monkeypatch.setenv("TUNECACHE_DB", str(tmp_path / "tune.db"))
    assert tc_inductor.enable()
    try:
        assert inductor_config.compile_threads == 1
    finally:
        tc_inductor.disable()


def test_store_failure_never_fails_the_kernel(tmp_path):
    # A database nobody can open: the kernel loads and saves as without tunecache.
    bad = tmp_path / "no-such-dir" / "sub" / "tune.db"
    (tmp_path / "no-such-dir").write_text("a file, so the directory cannot be made")
    cache = tunecache.open(str(bad), triton_configs=True)
    assert tc_inductor.enable(cache)
    tc_inductor.triton_stats.reset()
    try:
        cfgs, autotune_cache, info = load(kernel_file(tmp_path, 0), meta())
        assert info["autotune_cache_state"] == "miss" and len(cfgs) == 3
        autotune_cache.save(cfgs[0], 1_000_000)
        s = tc_inductor.triton_stats.as_dict()
        assert s["hits"] == 0 and s["published"] == 0
    finally:
        tc_inductor.disable()
        cache.close()


# ------------------------------------------- hostile stored configs: refused, or fallen back

# Reduction-like configs: the constexprs this kernel's configs use are XBLOCK and R0_BLOCK.
def _own() -> list[FakeConfig]:
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


def _warnings(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tunecache" and r.levelno >= logging.WARNING]


# Not one of the kernel's own configs, so Inductor rebuilds it from the entry (as it
# does a coordinate-descent result) rather than pick its own matching config.
_FINE = {"num_warps": 4, "num_stages": 1, "XBLOCK": 16, "R0_BLOCK": 128}


@pytest.mark.parametrize("hostile, reason", [
    ({"num_warps": 64}, "num_warps"),  # CUDA: "invalid argument" at launch
    ({"XBLOCK": 1 << 20, "R0_BLOCK": 1 << 20}, "BLOCK"),  # a Triton CompilationError
    ({"XBLOCK": 8192}, "XBLOCK"),  # above Inductor's X limit
    ({"R0_BLOCK": 1 << 17}, "R0_BLOCK"),  # above Inductor's R0_ limit
    ({"EVIL": 4}, "not this kernel's"),  # an unknown constexpr: a Triton ValueError
    ({"num_ctas": 2}, "not this kernel's"),
    ({"R0_BLOCK": None}, "not this kernel's"),  # a constexpr the kernel needs is missing
    ({"XBLOCK": 0}, "XBLOCK"),
    ({"XBLOCK": -8}, "XBLOCK"),
    ({"R0_BLOCK": 48}, "R0_BLOCK"),
    ({"XBLOCK": "8"}, "XBLOCK"),
    ({"XBLOCK": 8.0}, "XBLOCK"),
    ({"XBLOCK": True}, "XBLOCK"),
    ({"num_warps": "4"}, "num_warps"),
    ({"num_warps": 12}, "num_warps"),
    ({"num_stages": 2.5}, "num_stages"),
    ({"num_stages": 1000}, "num_stages"),
    ({"num_stages": -1}, "num_stages"),
])
def test_a_stored_config_the_kernel_could_not_have_is_refused_with_one_warning(
    enabled, tmp_path, monkeypatch, caplog, hostile, reason
):
    monkeypatch.setattr(ac, "Config", TritonConfig)  # triton.Config; no triton on the CPU
    entry = {k: v for k, v in {**_FINE, **hostile}.items() if v is not None}
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for body in ("tmp0 + tmp1", "tmp0 * tmp1", "tmp0 - tmp1"):
            plant(enabled, kernel_file(tmp_path, 0, body=body), meta(), entry, _own())
            cfgs, _, info = load(kernel_file(tmp_path, 1, body=body), meta(), _own())
            # As without an entry: Inductor tunes its own configs.
            assert info["autotune_cache_state"] == "miss"
            assert [c.kwargs for c in cfgs] == [c.kwargs for c in _own()]
    (warning,) = _warnings(caplog)  # one per reason in a process, not one per kernel
    assert reason in warning and "refused" in warning, warning
    assert tc_inductor.triton_stats.invalid == 3 and tc_inductor.triton_stats.hits == 0
    # Left alone in the database, as any entry that fails validation.
    assert [r["state"] for r in stored(enabled)] == ["done"] * 3


def test_the_hostile_cases_are_refused_by_entry_validation():
    from tunecache.inductor.triton.keys import triton_config_problem

    for hostile in ({"num_warps": 64}, {"XBLOCK": 1 << 20}, {"R0_BLOCK": 1 << 20},
                    {"num_stages": 17}, {"XBLOCK": 2.0}, {"maxnreg": 1 << 20},
                    {"num_ctas": 3}, {"RSPLIT": 128}):
        entry = {**_FINE, **hostile, "configs_hash": "h"}
        assert triton_config_problem(entry) is not None, hostile
        assert tc_inductor.triton_config_from_entry({json.dumps(entry): 1.0}) is None
    assert triton_config_problem({**_FINE, "configs_hash": "h"}) is None


def test_a_config_without_xblock_fits_only_a_kernel_without_an_x_dimension():
    # cached_autotune drops XBLOCK (1 there) from such a kernel's configs, and a config
    # saved for it has none; a kernel that has an x dimension needs it.
    from tunecache.inductor.triton.keys import kernel_config_problem

    stored = TritonConfig({"R0_BLOCK": 256}, 4, 1)
    assert kernel_config_problem(stored, [FakeConfig(4, XBLOCK=1, R0_BLOCK=128)]) is None
    problem = kernel_config_problem(stored, [FakeConfig(4, XBLOCK=8, R0_BLOCK=128)])
    assert problem is not None and "not this kernel's" in problem


def test_tiny_blocks_32_warps_and_16_stages_are_still_used(enabled, tmp_path, monkeypatch,
                                                           caplog):
    # What ran correctly under Triton on CUDA: a coordinate-descent result may go below the
    # kernel's own configs (XBLOCK=1, R0_BLOCK=2) and up to 32 warps and 16 stages.
    monkeypatch.setattr(ac, "Config", TritonConfig)
    entry = {"num_warps": 32, "num_stages": 16, "XBLOCK": 1, "R0_BLOCK": 2}
    plant(enabled, kernel_file(tmp_path, 0), meta(), entry, _own())
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        cfgs, _, info = load(kernel_file(tmp_path, 1), meta(), _own())
    assert info["autotune_cache_state"] == "hit" and _warnings(caplog) == []
    assert (cfgs[0].kwargs, cfgs[0].num_warps, cfgs[0].num_stages) == (
        {"XBLOCK": 1, "R0_BLOCK": 2}, 32, 16)


@pytest.fixture
def broken(enabled, monkeypatch):
    """tunecache enabled, with a faked Triton that refuses what tests put in
    FAILS_TO_COMPILE / FAILS_TO_LAUNCH."""
    import triton_fake_autotuner as fa

    monkeypatch.setattr(ac, "Config", TritonConfig)
    monkeypatch.setattr(fa, "FAILS_TO_COMPILE", [])
    monkeypatch.setattr(fa, "FAILS_TO_LAUNCH", [])
    return SimpleNamespace(cache=enabled, fa=fa)


# A valid config, not one of the kernel's own (a coordinate-descent result elsewhere).
_STORED = {"num_warps": 16, "num_stages": 1, "XBLOCK": 1024}


def _broken_kernels(broken: Any, tmp_path: Path, n: int = 2, first: int = 0) -> list[Any]:
    """``n`` kernels loaded with _STORED stored for each (a hit each)."""
    kernels = []
    for i in range(first, first + n):
        body = f"tmp0 + {i}"
        plant(broken.cache, kernel_file(tmp_path, 0, body=body), meta(), _STORED, configs())
        k = broken.fa.load_autotuner(kernel_file(tmp_path, 1, body=body), meta(), configs())
        assert k.autotune_cache_info["autotune_cache_state"] == "hit"
        kernels.append(k)
    return kernels


def test_a_stored_config_that_fails_to_compile_falls_back_to_inductors_tuning(
    broken, tmp_path, caplog
):
    broken.fa.FAILS_TO_COMPILE.append(lambda cfg: cfg.kwargs["XBLOCK"] == 1024)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for k in _broken_kernels(broken, tmp_path):
            k.precompile()  # as AsyncCompile.triton does after loading the kernel
            # Inductor's own configs compiled and benchmarked; it picks the last one.
            assert k.run("arg", stream=0) == ("ran", {"XBLOCK": 64}, 2, ("arg",))
            assert [(c.kwargs, c.num_warps) for c in k.compiled] == [
                ({"XBLOCK": 1024}, 16), ({"XBLOCK": 128}, 4), ({"XBLOCK": 512}, 8),
                ({"XBLOCK": 64}, 2)]
    (warning,) = _warnings(caplog)
    assert "compil" in warning and "FakeCompilationError" in warning, warning
    assert tc_inductor.triton_stats.stored_config_failed == 2
    assert [r["state"] for r in stored(broken.cache)] == ["done", "done"]


def test_a_stored_config_that_fails_to_launch_falls_back_to_inductors_tuning(
    broken, tmp_path, caplog
):
    broken.fa.FAILS_TO_LAUNCH.append(lambda cfg: cfg.kwargs["XBLOCK"] == 1024)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for k in _broken_kernels(broken, tmp_path):
            k.precompile()
            assert k.run("a", stream=0) == ("ran", {"XBLOCK": 64}, 2, ("a",))
            assert k.run("b", stream=0) == ("ran", {"XBLOCK": 64}, 2, ("b",))
            assert k.run("c", stream=0) == ("ran", {"XBLOCK": 64}, 2, ("c",))
            assert [c.kwargs["XBLOCK"] for c in k.launched] == [64, 64, 64]
            assert k.launchers[0].config.kwargs == {"XBLOCK": 64}
    (warning,) = _warnings(caplog)
    assert "launch" in warning and "invalid argument" in warning, warning
    assert tc_inductor.triton_stats.stored_config_failed == 2


def test_a_stored_config_that_launches_is_launched_directly_after_its_first_run(
    broken, tmp_path
):
    (k,) = _broken_kernels(broken, tmp_path, 1)
    k.precompile()
    for arg in "abc":
        assert k.run(arg, stream=0) == ("ran", {"XBLOCK": 1024}, 16, (arg,))
    # Nothing of tunecache's stays between the run and the stored config's launcher.
    assert type(k.launchers[0]) is broken.fa.FakeRunLauncher
    assert type(k._cached_launcher) is broken.fa.FakeRunLauncher


def test_a_kernel_that_fails_with_inductors_own_configs_too_raises_their_error(
    broken, tmp_path
):
    # Not the stored config's fault: the job fails as it would without tunecache, with
    # the error of Inductor's own config.
    broken.fa.FAILS_TO_LAUNCH.append(lambda cfg: True)
    (k,) = _broken_kernels(broken, tmp_path, 1)
    k.precompile()
    with pytest.raises(RuntimeError, match=r"invalid argument \(\{'XBLOCK': 64\}\)"):
        k.run("a", stream=0)  # the launch of the config Inductor picked
    broken.fa.FAILS_TO_COMPILE.append(lambda cfg: True)
    (k,) = _broken_kernels(broken, tmp_path, 1, first=1)
    with pytest.raises(broken.fa.FakeCompilationError, match=r"\{'XBLOCK': 128\}"):
        k.precompile()  # the compile of Inductor's first config


def test_a_stored_config_that_fails_to_compile_in_a_compile_worker_falls_back_there(
    tmp_path, monkeypatch
):
    """A real Inductor compile worker (SubprocPool): it compiles Inductor's own configs
    instead, and the kernel goes back to the compiling process as a miss."""
    import functools

    import triton_fake_autotuner as fa
    from torch._inductor.compile_worker.subproc_pool import SubprocPool

    db = str(tmp_path / "tune.db")
    monkeypatch.setenv("TUNECACHE_DB", db)
    monkeypatch.setenv("TUNECACHE_TRITON_CONFIGS", "1")
    monkeypatch.delenv("TUNECACHE_MODE", raising=False)
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    assert tc_inductor.enable()
    pool = SubprocPool(1)
    try:
        with tunecache.open(db) as peer:
            plant(peer, kernel_file(tmp_path, 0), meta(), _STORED, configs())
        done = pool.submit(fa.compile_in_worker, kernel_file(tmp_path, 1), meta(), configs(),
                           functools.partial(fa.xblock_at_least, 1024)).result(timeout=120)
        assert done["state"] == "miss"
        assert [kw["XBLOCK"] for kw, _ in done["compiled"]] == [128, 512, 64]
    finally:
        pool.shutdown()
        tc_inductor.disable()


def test_an_adopted_config_that_fails_to_launch_is_tuned_here(coordesc, caplog):
    # A peer's coordinate-descent result, adopted at this kernel's first run, that this
    # GPU cannot launch: coordinate descent runs here from the kernel's own config.
    import triton_fakes

    k, launcher, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key, wait=0.0)
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(32, XBLOCK=2048))
    triton_fakes.LAUNCH_FAILS.add(2048)
    try:
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            adopted = first_run(k, launcher)
            assert adopted.config.kwargs == {"XBLOCK": 2048}
            # run() launches what coordinate descent returned.
            assert adopted("arg", stream=0) == ("ran", TUNED.kwargs, TUNED.num_warps)
            assert adopted("arg", stream=0) == ("ran", TUNED.kwargs, TUNED.num_warps)
    finally:
        triton_fakes.LAUNCH_FAILS.discard(2048)
    assert coordesc.tuned == [launcher]
    assert k.launchers[0].config.kwargs == TUNED.kwargs
    (warning,) = _warnings(caplog)
    assert "launch" in warning, warning


def test_an_adopted_config_that_is_not_the_kernels_is_not_compiled(coordesc, caplog):
    k, launcher, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key, wait=0.0)
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(4, XBLOCK=64, EVIL=1))
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert first_run(k, launcher).config.kwargs == TUNED.kwargs
    assert k.compiled == [] and coordesc.tuned == [launcher]
    (warning,) = _warnings(caplog)
    assert "not this kernel's" in warning, warning


# ------------------------------------------------------------------ two processes


def _run_rank(db: str, tmp: Path, index: int, role: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / f"inductor-{index}")
    out = subprocess.run(
        [sys.executable, __file__, role, db, str(tmp), str(index)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_processes_share_one_best_config(tmp_path):
    db = str(tmp_path / "tune.db")
    first = _run_rank(db, tmp_path, 0, "tune")
    assert first["state"] == "miss" and first["stats"]["published"] == 1
    second = _run_rank(db, tmp_path, 1, "read")
    assert second["state"] == "hit"
    assert second["best"] == first["best"] == [{"XBLOCK": 512}, 8, 1]
    assert second["stats"]["hits"] == 1 and second["stats"]["puts"] == 0


def test_triton_sharing_is_off_when_opted_out(tmp_path):
    threads, remote = inductor_config.compile_threads, inductor_config.autotune_remote_cache
    cache = tunecache.open(str(tmp_path / "tune.db"), triton_configs=False)
    assert tc_inductor.enable(cache)
    try:
        assert inductor_config.compile_threads == threads
        assert inductor_config.autotune_remote_cache == remote
    finally:
        tc_inductor.disable()


def test_triton_sharing_is_on_by_default(tmp_path):
    remote = inductor_config.autotune_remote_cache
    cache = tunecache.open(str(tmp_path / "tune.db"))
    assert cache.settings.triton_configs
    assert tc_inductor.enable(cache)
    try:
        assert inductor_config.autotune_remote_cache is True
    finally:
        tc_inductor.disable()
    assert inductor_config.autotune_remote_cache == remote


def _coordesc_proc(tmp: Path, index: int, *, kernels: int, tune_seconds: float,
                   barrier: bool, lease: float = 2.0) -> subprocess.Popen[str]:
    # The short default lease: a killed or stopped rank's claim expires soon.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / f"inductor-{index}")
    return subprocess.Popen(
        [sys.executable, __file__, "coordesc", str(tmp / "tune.db"), str(tmp), str(index),
         str(kernels), str(tune_seconds), "barrier" if barrier else "alone", str(lease)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _wait_for(path: Path, seconds: float = 120) -> None:
    procs.wait_until(path.exists, f"{path} appearing", seconds)


def test_a_rank_killed_while_tuning_is_taken_over_by_its_peer(tmp_path):
    holder = _coordesc_proc(tmp_path, 0, kernels=1, tune_seconds=60, barrier=False)
    _wait_for(tmp_path / "tuning-0")  # it holds the claim, and tunes
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    peer = _result(_coordesc_proc(tmp_path, 1, kernels=1, tune_seconds=0.1, barrier=False))
    assert peer["tuned"] == [0]  # took the key over once the lease passed
    assert peer["final"] == [[{"XBLOCK": 128}, 4, True]]
    cache = tunecache.open(str(tmp_path / "tune.db"))
    try:
        (row,) = stored(cache)
    finally:
        cache.close()
    assert row["state"] == "done"
    assert json.loads(next(iter(json.loads(row["timings_json"]))))["XBLOCK"] == 128


def test_a_rank_stopped_past_its_lease_adopts_the_peers_result_when_it_resumes(tmp_path):
    holder = _coordesc_proc(tmp_path, 0, kernels=1, tune_seconds=4, barrier=False)
    _wait_for(tmp_path / "tuning-0")
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        peer = _result(_coordesc_proc(tmp_path, 1, kernels=1, tune_seconds=0.1,
                                      barrier=False))
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    stopped = _result(holder)
    assert peer["tuned"] == [0] and stopped["tuned"] == [0]  # both measured: it was late
    # Its late publish was refused, and it runs the stored config like its peer.
    assert stopped["final"] == peer["final"] == [[{"XBLOCK": 128}, 4, True]]


def test_two_processes_split_coordinate_descent_and_end_on_the_same_configs(tmp_path):
    # Two ranks run the same 8 kernels in the same order, step after step. Each rank's
    # fake coordinate descent finds a different config, so a kernel tuned by both, or
    # not adopted, would show. No claim may expire here: on a loaded machine a 2 s lease
    # can pass between a rank's claim and its publish, and its peer would tune it too.
    ranks = [_coordesc_proc(tmp_path, i, kernels=8, tune_seconds=0.3, barrier=True,
                            lease=60.0) for i in (0, 1)]
    a, b = (_result(r) for r in ranks)
    assert sorted(a["tuned"] + b["tuned"]) == list(range(8))  # each kernel tuned once
    assert a["tuned"] and b["tuned"]  # and the work was split
    # A kernel's configs were benchmarked by the rank that tuned it, and only there, the
    # first kernel too, which both ranks reached at the same moment.
    assert a["benchmarked"] == a["tuned"] and b["benchmarked"] == b["tuned"]
    assert a["final"] == b["final"]
    assert all(found for _, _, found in a["final"])
    assert a["deferred"] + b["deferred"] >= 1
    # Neither rank waited for the other: a deferred kernel ran untuned meanwhile.
    assert a["peer_wait_seconds"] == b["peer_wait_seconds"] == 0.0


def test_a_value_left_to_the_peer_is_not_taken_from_a_search_that_swallows_errors(fusion):
    # Should code between the search and the benchmark turn the "peer is measuring it"
    # signal into a timing (inf), that timing must not decide anything.
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

    fusion.timing.ms = _timing_by_size
    claim = fusion.peer.claim(_fusion_key(16))  # the peer finds 16 best of all
    fusion.timing.after_first_step = _when_measuring(
        32, lambda: fusion.peer.publish(claim, {"ms": 0.5}))

    def swallowing(value: int) -> float:
        try:
            return fusion.benchmark(0, value)[0]
        except Exception:  # noqa: BLE001 - the swallowing this test is about
            return math.inf

    best = CoordescTuner.autotune_single_field(swallowing, 16, 8)
    assert best == 16  # an inf for 16 would have moved the search to 8, then 32
    assert len(fusion.measured) == 2  # 8 and 32: 16 is the peer's
    assert tc_inductor.triton_stats.fusion_left_to_peer == 1


def test_two_processes_split_the_split_size_search_and_pick_the_same_value(tmp_path):
    # Each candidate value takes 0.5 s to measure (5 coordinate-descent benchmarks); the
    # search visits 8, 16, 32 (its first round), then one value a round: 64, 128 (the
    # best), 256.
    procs = []
    for index in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "split-size", str(tmp_path / "tune.db"),
             str(tmp_path), str(index)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    a, b = (_result(p) for p in procs)
    assert a["best"] == b["best"] == 128
    measured = sorted(a["measured"] + b["measured"])
    assert len(set(measured)) == len(measured)  # each value once in the job
    # ... every value the search asked for, and maybe the one past its end, measured
    # ahead by a rank while the other measured 256.
    assert set(measured) - {512} == {8, 16, 32, 64, 128, 256}
    assert a["measured"] and b["measured"]  # split between them
    assert a["left_to_peer"] + b["left_to_peer"] >= 1
    # The later rounds: one rank measured ahead while the other measured the value asked.
    assert a["ahead"] + b["ahead"] >= 1
    # 512, if started, was measured ahead of 256, which did not beat 128: it ran to the
    # end only if no benchmark of it came after 256's timing.
    assert a["stopped"] + b["stopped"] <= (512 in measured)


def _split_size_rank(db: str, tmp: str, index: int) -> None:
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

    measured: list[int] = []

    def inductors_own(self, mod, n_spills_threshold=8, node_names=None):
        measured.append(_size(mod.__file__))
        for step in range(5):  # the kernel's coordinate descent: the time it takes
            CoordescTuner.call_func(_CACHELESS_TUNER, lambda _: time.sleep(0.1), step)
        return _timing_by_size(mod.__file__, best=128) + index / 1000, mod.__file__

    TritonScheduling.benchmark_codegened_module = inductors_own
    cache = tunecache.open(db, triton_configs=True)
    tc_inductor.enable(cache)
    procs.file_barrier(Path(tmp), index, 2)

    def benchmark(rank: int, size: int) -> Any:
        mod = SimpleNamespace(__file__=kernel_file(Path(tmp), rank,
                                                   tail=benchmark_harness(rank, size)))
        return TritonScheduling.benchmark_codegened_module(object(), mod, 8)

    best = _split_size_search(benchmark, index)
    stats = tc_inductor.triton_stats.as_dict()
    tc_inductor.disable()
    print(json.dumps({"best": best, "measured": measured,
                      "left_to_peer": stats["fusion_left_to_peer"],
                      "ahead": stats["split_values_ahead"],
                      "stopped": stats["split_values_stopped"]}))


def _rank_main(role: str, db: str, tmp: str, index: int) -> None:
    cache = tunecache.open(db, triton_configs=True)
    tc_inductor.enable(cache)
    cfgs, autotune_cache, info = load(kernel_file(Path(tmp), index), meta())
    if role == "tune":
        assert len(cfgs) == 3
        cfgs = [cfgs[1]]  # "benchmarked": the second config won
        autotune_cache.save(cfgs[0], 5_000_000)
    tc_inductor.disable()
    best = cfgs[0]
    print(json.dumps({"state": info["autotune_cache_state"],
                      "best": [best.kwargs, best.num_warps, best.num_stages],
                      "stats": tc_inductor.triton_stats.as_dict()}))


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
    cache = tunecache.open(db, triton_configs=True)
    tc_inductor.enable(cache)
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
    stats = tc_inductor.triton_stats.as_dict()
    tc_inductor.disable()
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
