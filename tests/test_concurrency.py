"""The claim protocol under real concurrency: real processes, real SQLite files, the real
PostgreSQL server, SIGKILL and SIGSTOP. No mocks."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from queue import Empty
from typing import Any

import procs
import pytest
from sqlalchemy import select

import tunecache
from tunecache.keys import key_hash
from tunecache.store.migrate import head_revision
from tunecache.store.schema import entries

ctx = mp.get_context("fork")


def _gather(target, n: int, args: tuple, timeout: float = 300,
            context: Any = ctx) -> list[dict]:
    """Start n processes of target(*args, barrier, queue); each reports one dict."""
    barrier, queue = context.Barrier(n), context.Queue()
    workers = [context.Process(target=target, args=(*args, barrier, queue)) for _ in range(n)]
    for w in workers:
        w.start()
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        try:
            out.append(queue.get(timeout=1))
        except Empty:
            died = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            assert not died, f"a worker died before reporting (exit codes {died})"
            assert time.monotonic() < deadline, "the workers did not report in time"
    for w in workers:
        w.join(timeout=30)
        assert w.exitcode == 0
    return out


def _row(url: str, key: dict):
    cache = tunecache.open(url)
    h = key_hash(key)[0]
    with cache.store.db.engine.connect() as conn:
        row = conn.execute(select(entries).where(entries.c.key_hash == h)).one()
    cache.close()
    return row


def _wait_for(path: Path, timeout: float = 120) -> None:
    procs.wait_until(path.exists, f"{path} appearing", timeout)


@pytest.mark.slow
def test_16_processes_200_keys_each_key_tuned_once_and_all_agree(db_url):
    n_procs, n_keys = 16, 200
    reports = _gather(procs.share_keys, n_procs, (db_url, n_keys, 0.1))

    assert [m for r in reports for m in r["warnings"]] == []  # no fallback to local tuning
    tuned = [i for r in reports for i in r["tuned"]]
    assert sorted(tuned) == list(range(n_keys)), "every key tuned exactly once"
    assert all(r["results"] == reports[0]["results"] for r in reports), "same results everywhere"
    # Equal work splits evenly because a process claims one key at a time: it never holds
    # keys back from idle peers. (How many each tunes also depends on the OS scheduler.)
    assert {n for r in reports for n in r["claims_held"]} == {1}
    assert sum(r["sources"].count("tuned") for r in reports) == n_keys


def test_killed_owner_key_is_taken_over_after_its_lease(db_url, tmp_path):
    ready = tmp_path / "ready"
    # Leases of 2 s and more: the lock timeout is at most half the lease (Settings), and
    # PostgreSQL sessions time out statements after it, which a loaded machine can reach.
    owner = ctx.Process(target=procs.hold_claim_forever, args=(db_url, 2.0, ready))
    owner.start()
    _wait_for(ready)
    os.kill(owner.pid, signal.SIGKILL)
    owner.join()

    cache = tunecache.open(db_url, lease_seconds=2.0)
    started = time.monotonic()
    result = cache.get_or_tune({"kind": "test", "op": "mm", "i": 0}, lambda: {"new_owner": 2.0})
    cache.close()

    assert result.source == "tuned" and result.best == "new_owner"
    assert time.monotonic() - started < 30
    row = _row(db_url, {"kind": "test", "op": "mm", "i": 0})
    assert (row.state, row.token, row.attempts) == ("done", 2, 2)


def test_frozen_owner_late_publish_is_rejected_and_it_uses_the_new_result(db_url, tmp_path):
    ready, go = tmp_path / "ready", tmp_path / "go"
    queue = ctx.Queue()
    owner = ctx.Process(target=procs.publish_after_stop, args=(db_url, 2.0, ready, go, queue))
    owner.start()
    _wait_for(ready)
    os.kill(owner.pid, signal.SIGSTOP)  # heartbeat thread frozen with it
    try:
        cache = tunecache.open(db_url, lease_seconds=2.0)
        taken = cache.get_or_tune({"kind": "test", "op": "mm", "i": 0},
                                  lambda: {"new_owner_kernel": 0.7})
        cache.close()
        go.write_text("go")
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    late = queue.get(timeout=60)
    owner.join(timeout=30)

    assert taken.source == "tuned" and taken.best == "new_owner_kernel"
    assert late == {"source": "peer", "timings": {"new_owner_kernel": 0.7},
                    "best": "new_owner_kernel"}
    row = _row(db_url, {"kind": "test", "op": "mm", "i": 0})
    assert (row.state, row.token, row.best) == ("done", 2, "new_owner_kernel")


def test_poison_key_that_kills_its_tuner_ends_failed_and_waiters_get_that_answer(db_url):
    for _ in range(2):
        crasher = ctx.Process(target=procs.crash_while_tuning, args=(db_url, 2.0, 2))
        crasher.start()
        crasher.join(timeout=60)
        assert crasher.exitcode == 17

    cache = tunecache.open(db_url, lease_seconds=2.0, max_attempts=2)
    with pytest.raises(tunecache.KeyFailedError) as failed:
        cache.get_or_tune({"kind": "test", "op": "mm", "poison": True},
                          lambda: pytest.fail("a failed key is not tuned again"))
    [many] = cache.get_or_tune_many([{"kind": "test", "op": "mm", "poison": True}],
                                    lambda key: pytest.fail("not tuned again"))
    cache.close()
    assert failed.value.attempts == 2
    assert many.source == "failed" and many.best is None and many.error


def test_tuner_that_raises_gives_the_key_back_then_marks_it_failed(db_url):
    cache = tunecache.open(db_url, max_attempts=2)
    key = {"kind": "test", "op": "mm", "i": 99}

    def broken() -> dict[str, float]:
        raise RuntimeError("no kernel compiles")

    for _ in range(2):
        with pytest.raises(RuntimeError, match="no kernel compiles"):
            cache.get_or_tune(key, broken)
    with pytest.raises(tunecache.KeyFailedError, match="no kernel compiles"):
        cache.get_or_tune(key, broken)
    cache.close()


def test_32_processes_opening_an_empty_database_migrate_it_exactly_once(db_url):
    reports = _gather(procs.open_and_report, 32, (db_url,))
    assert [r.get("error") for r in reports] == [None] * 32
    assert sum(r["migrated"] for r in reports) == 1
    assert {r["revision"] for r in reports} == {head_revision()}


def test_cache_used_before_fork_works_in_the_child(sqlite_url):
    cache = tunecache.open(sqlite_url)
    cache.get_or_tune({"i": "parent"}, lambda: {"a": 1.0})
    queue = ctx.Queue()

    def child() -> None:
        result = cache.get_or_tune({"i": "child"}, lambda: {"b": 1.0})
        queue.put((result.source, cache.lookup({"i": "parent"}).source))

    p = ctx.Process(target=child)
    p.start()
    assert queue.get(timeout=60) == ("tuned", "hit")
    p.join()
    assert cache.lookup({"i": "child"}).best == "b"
    cache.close()
