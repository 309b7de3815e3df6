"""tunecache.inductor's Triton section.

Coordinate descent across ranks: a kernel's result adopted, claimed, or deferred.

Triton is not installed on the CPU test machines: autotune_helpers.py says how these tests
drive Inductor's own autotune-cache code with fake configs.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import procs  # noqa: E402
from autotune_helpers import (  # noqa: E402
    TUNED,
    first_run,
    first_run_while_the_peer_tunes,
    one_config,
    publish_as_peer,
)
from torch._inductor.runtime import triton_heuristics as th  # noqa: E402
from triton_fakes import (  # noqa: E402
    FakeConfig,
    FakeLauncher,
    configs,
)

import tunecache  # noqa: E402
from tunecache.inductor.state import REGISTRY  # noqa: E402
from tunecache.inductor.triton import coordesc as tc_coordesc  # noqa: E402
from tunecache.store.claims import Claim  # noqa: E402


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
    assert tunecache.stats().triton.coordesc_restored == 1
    assert coordesc.tuned == [launcher] and k.compiled == []


def test_a_kernel_a_peer_tuned_first_adopts_its_config_without_tuning(coordesc):
    k, launcher, key = coordesc.kernel(0)  # loaded (a miss) before the peer published
    claim = coordesc.peer.claim(key)
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256))
    adopted = first_run(k, launcher)
    assert (adopted.config.kwargs, adopted.config.num_warps) == ({"XBLOCK": 256}, 8)
    assert adopted.config.found_by_coordesc is True and k.compiled == [adopted.config]
    assert coordesc.tuned == [] and tunecache.stats().triton.adopted == 1


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
    stats = REGISTRY.triton_stats
    assert (stats.deferred, stats.adopted, stats.peer_wait_seconds) == (1, 1, 0.0)


def test_disable_gives_a_deferred_kernel_its_launcher_fast_path_back(coordesc):
    k, launcher, key = coordesc.kernel(0)
    coordesc.peer.claim(key)
    assert first_run(k, launcher) is launcher and k._cache_eligible is False  # deferred
    tunecache.disable()
    assert k._cache_eligible is True and "_tunecache_deferred" not in vars(k)


def test_inside_a_fusion_benchmark_a_peers_kernel_is_waited_for(coordesc, monkeypatch):
    # The benchmark times whatever config runs, so running it untuned would decide the
    # fusion on the wrong timing.
    monkeypatch.setattr(REGISTRY.fusion_local, "benchmarking", True, raising=False)
    adopted = first_run_while_the_peer_tunes(coordesc)
    assert adopted.config.kwargs == {"XBLOCK": 256} and adopted.config.found_by_coordesc
    assert tunecache.stats().triton.deferred == 0 and coordesc.tuned == []
    assert tunecache.stats().triton.peer_wait_seconds > 0


def test_a_kernel_a_peer_is_tuning_is_not_benchmarked_here(coordesc):
    k, _, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key)
    launcher = one_config(k)  # the first config, not benchmarked
    assert launcher.config.kwargs == configs()[0].kwargs and coordesc.benchmarked == []
    assert first_run(k, launcher) is launcher  # deferred: runs it until the peer's is in
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256))
    assert tunecache.stats().triton.configs_benchmark_skipped == 1


@pytest.mark.parametrize("run", [one_config, lambda k: first_run(k, FakeLauncher(configs()[0]))],
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
    launcher = one_config(k)
    assert launcher.config.kwargs == configs()[-1].kwargs  # the fake benchmark's winner
    assert coordesc.benchmarked == [k]
    assert first_run(k, launcher).config.kwargs == TUNED.kwargs
    assert tunecache.stats().triton.configs_benchmark_skipped == 0


def test_a_free_kernel_is_claimed_before_its_configs_are_benchmarked(coordesc):
    # A peer reaching the kernel during that benchmark leaves both it and the coordinate
    # descent to this rank.
    k, _, key = coordesc.kernel(0)
    launcher = one_config(k)
    assert coordesc.peer.claim(key, wait=0.0) is None  # held: the peer would skip it
    assert first_run(k, launcher).config.kwargs == TUNED.kwargs  # under that claim
    assert coordesc.tuned == [launcher] and tunecache.stats().triton.published == 1


def test_a_claim_taken_for_a_configs_benchmark_is_given_back_if_no_tuning_follows(
        coordesc):
    k, _, key = coordesc.kernel(0)
    one_config(k)
    other, _, _ = coordesc.kernel(0, body="tmp0 * tmp1")
    one_config(other)  # this thread went on to another kernel without tuning the first
    assert isinstance(coordesc.peer.claim(key, wait=0.0), Claim)


def test_a_failed_configs_benchmark_gives_the_key_back_at_once(coordesc):
    coordesc.fail.append(True)
    k, _, key = coordesc.kernel(0)
    with pytest.raises(RuntimeError, match="benchmark failed"):
        one_config(k)
    assert isinstance(coordesc.peer.claim(key, wait=0.0), Claim)


def test_under_cuda_graph_trees_a_peers_kernel_is_waited_for_not_deferred(
        coordesc, monkeypatch):
    monkeypatch.setattr(tc_coordesc, "_cuda_graph_trees_in_use", lambda kernel: True)
    adopted = first_run_while_the_peer_tunes(coordesc)
    assert adopted.config.kwargs == {"XBLOCK": 256} and adopted.config.found_by_coordesc
    assert tunecache.stats().triton.deferred == 0 and coordesc.tuned == []


def test_a_deferred_kernel_recorded_in_a_cuda_graph_keeps_its_first_config(
        coordesc, monkeypatch):
    k, launcher, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key)
    assert first_run(k, launcher) is launcher  # deferred
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(8, XBLOCK=256))
    monkeypatch.setattr(tc_coordesc, "_capturing", lambda: True)
    assert first_run(k, launcher) is launcher  # no compile while capturing
    assert launcher.config.found_by_coordesc is True and k.compiled == []
    assert k._cache_eligible is True and tunecache.stats().triton.kept_untuned == 1


def test_a_free_kernel_is_claimed_tuned_and_published_for_the_peers(coordesc):
    k, launcher, key = coordesc.kernel(0)
    assert first_run(k, launcher).config.found_by_coordesc
    assert coordesc.tuned == [launcher]
    stored = coordesc.peer.lookup(key)
    assert stored is not None and json.loads(stored.best)["XBLOCK"] == 1024
    assert json.loads(stored.best)["found_by_coordesc"] is True
    assert tunecache.stats().triton.published == 1


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
    assert coordesc.tuned == [] and tunecache.stats().triton.deferred == 1
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
    cache = tunecache.open(str(tmp_path / "tune.db"))
    assert tunecache.enable(cache)
    try:
        hit = SimpleNamespace(autotune_cache_info={"autotune_cache_state": "hit"})
        miss = SimpleNamespace(autotune_cache_info={"autotune_cache_state": "miss"})
        th.CachingAutotuner._dynamic_scale_rblock(hit)
        th.CachingAutotuner._dynamic_scale_rblock(miss)
        assert expanded == [miss]
    finally:
        tunecache.disable()
        cache.close()
    assert th.CachingAutotuner._dynamic_scale_rblock is inductors_own_2_11
