"""tunecache.inductor's Triton section.

The entry point, compile workers and store failures.

Triton is not installed on the CPU test machines: autotune_helpers.py says how these tests
drive Inductor's own autotune-cache code with fake configs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from autotune_helpers import (  # noqa: E402
    load,
)
from torch._inductor import config as inductor_config  # noqa: E402
from triton_fakes import (  # noqa: E402
    kernel_file,
    meta,
)

import tunecache  # noqa: E402
from tunecache.inductor.triton.remote import TritonCache  # noqa: E402
from tunecache.opener import CacheOpener  # noqa: E402


def test_entry_point_plugs_in_while_triton_heuristics_is_still_importing(tmp_path):
    # A compile worker: the first import is triton_heuristics, which imports
    # autotune_cache (the module our autoload hook watches) before CachingAutotuner exists.
    env = {**os.environ, "TUNECACHE_DB": str(tmp_path / "tune.db"),
           "TUNECACHE_SHARE": "+triton"}
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


def test_worker_reopens_a_database_it_could_not_reach_at_its_first_look(tmp_path,
                                                                         monkeypatch):
    # A compile worker's cache (the process does not compile: retry_seconds is set) that
    # looked before the database's directory was there opens afresh once it is.
    db = tmp_path / "later" / "tune.db"
    monkeypatch.setenv("TUNECACHE_DB", str(db))
    env_cache = CacheOpener(tunecache.Settings.from_env(), retry_seconds=0.0)
    first = env_cache()
    assert first.lookup({"kind": "gemm", "op": "x"}) is None
    assert first.disabled_reason is not None and not db.exists()  # no directory made
    db.parent.mkdir()
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
    env_cache = CacheOpener(tunecache.Settings.from_env(), retry_seconds=10.0)
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
    assert tunecache.stats().triton.errors == 0
    env_cache.close()


def test_compile_threads_drop_to_one_when_workers_cannot_read_the_cache(
    tmp_path, monkeypatch
):
    # Explicitly enabled on a database the environment does not name: the workers'
    # entry point would open another one (or none), so kernels load in this process.
    monkeypatch.setenv("TUNECACHE_DB", str(tmp_path / "other.db"))
    monkeypatch.setenv("TUNECACHE_SHARE", "+triton")
    threads = inductor_config.compile_threads
    cache = tunecache.open(str(tmp_path / "tune.db"))
    assert tunecache.enable(cache)
    try:
        assert inductor_config.compile_threads == 1
    finally:
        tunecache.disable()
        cache.close()
    assert inductor_config.compile_threads == threads
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    monkeypatch.setenv("TUNECACHE_DB", str(tmp_path / "tune.db"))
    assert tunecache.enable()
    try:
        assert inductor_config.compile_threads == 1
    finally:
        tunecache.disable()


def test_store_failure_never_fails_the_kernel(tmp_path):
    # A database nobody can open: the kernel loads and saves as without tunecache.
    bad = tmp_path / "no-such-dir" / "sub" / "tune.db"
    (tmp_path / "no-such-dir").write_text("a file, so the directory cannot be made")
    cache = tunecache.open(str(bad))
    assert tunecache.enable(cache)
    tunecache.reset_stats()
    try:
        cfgs, autotune_cache, info = load(kernel_file(tmp_path, 0), meta())
        assert info["autotune_cache_state"] == "miss" and len(cfgs) == 3
        autotune_cache.save(cfgs[0], 1_000_000)
        s = tunecache.stats().triton.as_dict()
        assert s["hits"] == 0 and s["published"] == 0
    finally:
        tunecache.disable()
        cache.close()
