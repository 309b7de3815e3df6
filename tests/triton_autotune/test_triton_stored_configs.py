"""tunecache.inductor's Triton section.

A kernel load's get, claim and put: a miss tuned and published, a hit, a hostile entry.

Triton is not installed on the CPU test machines: autotune_helpers.py says how these tests
drive Inductor's own autotune-cache code with fake configs.
"""

from __future__ import annotations

import json
import time

import pytest

torch = pytest.importorskip("torch")

from autotune_helpers import (  # noqa: E402
    create,
    load,
    stored,
)
from torch._inductor import config as inductor_config  # noqa: E402
from triton_fakes import (  # noqa: E402
    FakeConfig,
    kernel_file,
    meta,
)

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402


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
    s = tunecache.stats().triton.as_dict()
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
    assert tunecache.stats().triton.published == 1


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
    s = tunecache.stats().triton.as_dict()
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
        assert tunecache.stats().triton.unpublished == 1
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
    monkeypatch.setenv("TUNECACHE_SHARE", "+triton")
    monkeypatch.delenv("TUNECACHE_MODE", raising=False)
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    threads = inductor_config.compile_threads
    assert threads > 1
    assert tunecache.enable()  # from the environment, as the entry point does
    tunecache.reset_stats()
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
        assert tunecache.stats().triton.published == 1
        again = pool.submit(triton_fakes.load_kernel, kernel_file(tmp_path, 1), meta())
        again = again.result(timeout=120)
        assert again["state"] == "hit"
        assert [(c.kwargs, c.num_warps) for c in again["configs"]] == [({"XBLOCK": 512}, 8)]
    finally:
        pool.shutdown()
        tunecache.disable()
    assert inductor_config.compile_threads == threads
