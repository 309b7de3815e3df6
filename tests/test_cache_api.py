"""The public API on one process: hits, winners, readonly mode, usage counting."""

from __future__ import annotations

import dataclasses
import math

import pytest
from sqlalchemy import func, select, text

import tunecache
from tunecache import keys as keys_module
from tunecache.keys import Key, key_hash
from tunecache.store import Database
from tunecache.store.schema import entries, usage


def test_second_call_is_a_hit_with_the_same_timings_and_winner(db_url):
    calls = []

    def tune() -> dict[str, float]:
        calls.append(1)
        return {"b_kernel": 1.0, "a_kernel": 1.0, "slow": 3.0, "broken": math.inf}

    with tunecache.open(db_url) as cache:
        first = cache.get_or_tune({"op": "mm", "m": 8}, tune)
        second = cache.get_or_tune({"m": 8, "op": "mm"}, tune)  # same key, other order
    assert calls == [1]
    assert (first.source, second.source) == ("tuned", "hit")
    assert first.timings == second.timings
    assert second.timings["broken"] == math.inf
    assert first.best == second.best == "a_kernel"  # tie broken by name


def test_get_or_tune_many_keeps_the_callers_order_and_duplicates(db_url):
    keys = [{"i": 3}, {"i": 1}, {"i": 3}, {"i": 2}]
    with tunecache.open(db_url) as cache:
        results = cache.get_or_tune_many(
            keys, lambda key: {f"k{key.mapping['i']}": float(key.mapping["i"])})
    assert [r.best for r in results] == ["k3", "k1", "k3", "k2"]
    assert results[0] == results[2]


def test_a_key_object_is_the_same_key_as_its_mapping_and_is_hashed_once(db_url, monkeypatch):
    mapping = {"kind": "gemm", "op": "mm", "env": {"device": "H200"}, "m": 8}
    key = Key.of(mapping)
    assert Key.of(key) is key and key == Key.of(dict(reversed(list(mapping.items()))))
    assert (key.hash, key.json) == key_hash(mapping)
    assert key.labels["op"] == "mm" and key.labels["device"] == "H200"
    hashed = []
    real_key_hash = keys_module.key_hash
    monkeypatch.setattr(keys_module, "key_hash", lambda k: hashed.append(1) or real_key_hash(k))
    seen = []
    with tunecache.open(db_url) as cache:
        first = cache.get_or_tune_many([key], lambda k: seen.append(k) or {"a": 1.0})[0]
        assert cache.lookup(key) == cache.lookup(mapping) == dataclasses.replace(first,
                                                                                 source="hit")
        claimed = cache.claim(Key.of({"op": "mm", "m": 9}))
        assert cache.in_progress({"op": "mm", "m": 9})
        assert cache.publish(claimed, {"b": 2.0}).source == "tuned"
    assert seen == [key] and seen[0] is key  # the tuner gets the caller's Key
    assert seen[0].mapping is mapping  # and, in it, the caller's mapping
    assert first.key_hash == key.hash and first.source == "tuned"
    assert len(hashed) == 3  # lookup(mapping), Key.of({... 9}), in_progress(mapping): once each


def test_a_tuner_reads_the_key_it_gets_as_the_mapping_it_asked_for(db_url):
    mapping = {"op": "mm", "m": 7, "inputs": [[1, 2]]}
    read = []
    with tunecache.open(db_url) as cache:
        cache.get_or_tune_many([mapping], lambda k: read.append(
            (k["op"], k.get("m"), dict(k), len(k), "inputs" in k)) or {"a": 1.0})
    assert read == [("mm", 7, mapping, 3, True)]


def test_a_cache_that_released_its_connections_keeps_working(db_url):
    with tunecache.open(db_url) as cache:
        cache.get_or_tune({"op": "mm", "m": 8}, lambda: {"a": 1.0})
        cache.release_connections()
        assert cache.lookup({"op": "mm", "m": 8}).timings == {"a": 1.0}


def test_readonly_mode_reads_hits_and_never_writes(db_url):
    with tunecache.open(db_url) as writer:
        writer.get_or_tune({"i": 1}, lambda: {"a": 1.0})
    count = select(func.count()).select_from(entries)
    with tunecache.open(db_url, mode="readonly") as reader:
        hit = reader.get_or_tune({"i": 1}, lambda: pytest.fail("a hit is not tuned"))
        miss = reader.get_or_tune({"i": 2}, lambda: {"b": 1.0})
        reader.flush_usage()
        db = reader.store.db
        rows = db.run(lambda c: c.execute(count).scalar())
        hits = db.run(lambda c: c.execute(select(entries.c.hits)).scalar())
        usage_rows = db.run(lambda c: c.execute(select(func.count()).select_from(usage)).scalar())
    assert (hit.source, miss.source) == ("hit", "local")
    assert (rows, hits, usage_rows) == (1, 0, 1)  # the one usage row is the writer's


def test_readonly_mode_never_creates_a_database_file(tmp_path):
    path = tmp_path / "missing.db"
    with tunecache.open(str(path), mode="readonly") as reader:
        assert reader.get_or_tune({"i": 1}, lambda: {"a": 1.0}).source == "local"
        assert "unable to open" in reader.disabled_reason
    assert not path.exists()


def test_readonly_mode_never_migrates_and_says_how_to(db_url):
    Database(db_url).run(lambda conn: None, write=True)  # exists, but has no schema
    with tunecache.open(db_url, mode="readonly") as reader:
        assert reader.get_or_tune({"i": 1}, lambda: {"a": 1.0}).source == "local"
        assert "run `tunecache upgrade`" in reader.disabled_reason
    with tunecache.open(db_url, mode="readonly") as reader:
        # Still unmigrated: the readonly process wrote nothing, not even the schema.
        assert reader.lookup({"i": 1}) is None


def test_usage_is_written_in_one_batch_on_flush(db_url):
    with tunecache.open(db_url) as cache:
        cache.get_or_tune({"i": 1}, lambda: {"a": 1.0})
        for _ in range(5):
            cache.get_or_tune({"i": 1}, lambda: pytest.fail("hit"))
        db = cache.store.db
        before = db.run(lambda c: c.execute(select(entries.c.hits)).scalar())
        cache.flush_usage()
        after = db.run(lambda c: c.execute(select(entries.c.hits)).scalar())
        row = db.run(lambda c: c.execute(select(usage)).one())
    assert (before, after) == (0, 5)
    assert (row.hits, row.tuned) == (5, 1)
    assert row.seconds_saved >= 0


def test_timings_with_nan_from_a_tuner_are_rejected_before_publishing(db_url):
    with tunecache.open(db_url) as cache:
        with pytest.raises(tunecache.InvalidEntryError, match="nan"):
            cache.get_or_tune({"i": 1}, lambda: {"a": float("nan")})
        # The claim was given back: a good tuner can still fill the key.
        assert cache.get_or_tune({"i": 1}, lambda: {"a": 1.0}).source == "tuned"


def test_keys_that_are_not_json_are_refused_with_a_clear_error(db_url):
    with tunecache.open(db_url) as cache:
        with pytest.raises(TypeError, match="JSON-able"):
            cache.get_or_tune({"shape": object()}, lambda: {"a": 1.0})
        with pytest.raises(TypeError, match="mapping"):
            cache.get_or_tune(["not", "a", "mapping"], lambda: {"a": 1.0})  # type: ignore[arg-type]


def test_key_nested_too_deeply_for_json_is_refused_with_a_clear_error(db_url):
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with tunecache.open(db_url) as cache, \
            pytest.raises(ValueError, match="nested too deeply") as error:
        cache.get_or_tune({"shape": deep}, lambda: {"a": 1.0})
    assert "\n" not in str(error.value)


def _claim_with_a_clock_an_hour_ahead(url: str) -> None:
    """Leave a claim on {"i": 1}, taken by a process whose clock (time.time) is an hour
    ahead of the database server's (and of this host's)."""
    import subprocess
    import sys

    script = (
        "import os, sys, time\n"
        "real = time.time\n"
        "time.time = lambda: real() + 3600.0\n"
        "import tunecache\n"
        "claim = tunecache.open(sys.argv[1]).claim({'i': 1}, lease_seconds=60)\n"
        "assert type(claim).__name__ == 'Claim', claim\n"
        "os._exit(0)  # no close: the claim stays as written\n"
    )
    subprocess.run([sys.executable, "-c", script, url], check=True, timeout=120)


def test_postgresql_time_comes_from_the_database(pg_url):
    """Stamps and leases come from the server's clock, whatever the client's says. Stamps
    taken from the client's time.time() fail this by an hour; comparing created_at with
    the server's clock alone, as this test did, could not fail: the test server shares
    this host's clock."""
    from tunecache.settings import resolve_db_url

    _claim_with_a_clock_an_hour_ahead(pg_url)
    db = Database(resolve_db_url(pg_url))
    row = db.run(lambda c: c.execute(text(
        "SELECT created_at, updated_at, lease_expires_at, "
        "extract(epoch from clock_timestamp()) AS now FROM tunecache_entries"
    )).one())
    db.dispose()
    now = float(row.now)
    assert 0 <= now - row.created_at < 60 and 0 <= now - row.updated_at < 60
    assert 0 < row.lease_expires_at - now <= 60


def test_a_key_whose_candidates_all_failed_is_a_result_not_an_error(db_url):
    # A compile can add one Triton config that needs more shared memory than the GPU
    # has; tuning just that candidate gives only inf, and peers must get that answer.
    with tunecache.open(db_url) as cache:
        tuned = cache.get_or_tune({"i": "oom"}, lambda: {"triton_big": math.inf})
        hit = cache.get_or_tune({"i": "oom"}, lambda: pytest.fail("a hit"))
    assert (tuned.source, hit.source) == ("tuned", "hit")
    assert hit.timings == {"triton_big": math.inf} and hit.best is None
