"""Leases of live owners: every claim a process holds is renewed until it is
published or given back; the wait timeout counts only time spent waiting on peers; a result
tuned here survives a database that fails at publish time; the heartbeat reports only
claims that were really lost. Real processes, real SQLite files, the real PostgreSQL server.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import sqlite3
import threading
import time

import procs
import psycopg
import pytest
from sqlalchemy import select, text
from test_concurrency import _gather, _row, _wait_for

import tunecache
from tunecache.keys import Key, key_hash
from tunecache.store import ClaimStore, Database, Publication, ensure_schema
from tunecache.store.schema import entries

ctx = mp.get_context("fork")


def _lost_claims(messages: list[str]) -> list[str]:
    return [m for m in messages if "lost the claim" in m]


@pytest.mark.slow
def test_batched_claims_of_live_owners_are_never_taken_over(db_url):
    # The failure seen in soak runs: after cheap tunes a process claims keys in batches,
    # and slow keys later in a batch outlast the lease unless the heartbeat renews them all.
    # Four times this test's first scale (lease 6 s, slow keys 3.2 s: a batch's later
    # keys still outlast the lease): a process waits at most the lock timeout, half the
    # lease, for a lock, and with two cores kept busy a peer's SQLite transaction was
    # seen to hold one longer than the 0.75 s that a 1.5 s lease allows (1 run in 20
    # beside a CPU hog). On PostgreSQL the long waits were deadlocks between two steps,
    # 1 s each to detect (1 run in 20 still timed out at this scale): the next test.
    scale = 4
    n_cheap, n_slow = 48, 12
    reports = _gather(procs.cheap_then_slow_keys, 3,
                      (db_url, 1.5 * scale, n_cheap, n_slow, 0.8 * scale))

    assert [m for r in reports for m in r["warnings"]] == []  # no rejected publish
    tuned = sorted(i for r in reports for i in r["tuned"])
    assert tuned == list(range(n_cheap + n_slow)), "every key tuned exactly once"
    assert all(r["results"] == reports[0]["results"] for r in reports)
    assert {s for r in reports for s in r["sources"]} <= {"tuned", "hit", "peer"}


def test_step_that_publishes_and_claims_never_deadlocks_with_a_peer_that_read_before_it(
    pg_url,
):
    # The batched-claims test's rare "still locked after 3s" on PostgreSQL: a peer's step
    # read the keys before our claim on `ours` committed, so it inserts `ours` late; our
    # next step publishes `ours` and claims `theirs`, which that peer inserted first.
    # Published before claiming, `ours` was locked by us while we waited for the peer:
    # a deadlock, 1 s to detect, and the retries deadlocked again under load. The peer
    # here checks for deadlocks at once, so a cycle fails the test instead of costing us
    # a retry that would hide it.
    db = Database(pg_url)
    ensure_schema(db)
    store = ClaimStore(db)
    ours, theirs = Key.of({"kind": "test", "i": "ours"}), Key.of({"kind": "test", "i": "theirs"})

    def step(**kw) -> object:
        return store.step(limit=1, owner="us", lease_seconds=60.0, max_attempts=3, **kw)

    claim = step(publish=[], candidates=[ours]).claimed[0]
    insert = ("INSERT INTO tunecache_entries (key_hash, key_json, state, owner, token, "
              "lease_expires_at, attempts, created_at, updated_at, hits) "
              "VALUES (%s, %s, 'claimed', 'peer', 1, 1e12, 1, 0, 0, 0) "
              "ON CONFLICT (key_hash) DO NOTHING")
    outcome: list[object] = []
    with psycopg.connect(pg_url, autocommit=True) as watcher, psycopg.connect(pg_url) as peer:
        peer.execute("SET LOCAL deadlock_timeout = '10ms'")
        peer.execute(insert, (theirs.hash, theirs.json))
        ours_step = threading.Thread(target=lambda: outcome.append(step(
            publish=[Publication(claim, '{"k": 1.0}', "k", 0.0)], candidates=[theirs])))
        ours_step.start()
        _wait_until(lambda: watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO tunecache_entries%%' "
            "AND application_name = 'tunecache'"
        ).fetchone()[0] == 1, "our step waiting for the peer's insert")
        peer.execute(insert, (ours.hash, ours.json))  # DeadlockDetected before the fix
        peer.commit()
        ours_step.join(60)

    assert len(outcome) == 1
    assert (outcome[0].published, outcome[0].claimed) == ([True], [])
    assert _row(pg_url, ours.mapping).state == "done"
    theirs_row = _row(pg_url, theirs.mapping)
    assert (theirs_row.state, theirs_row.owner) == ("claimed", "peer")


def test_wait_timeout_counts_from_when_waiting_starts_not_from_the_call(db_url, tmp_path):
    mine, theirs = {"kind": "test", "i": "mine"}, {"kind": "test", "i": "theirs"}
    ready, go = tmp_path / "ready", tmp_path / "go"
    peer = ctx.Process(target=procs.publish_when_told, args=(db_url, theirs, ready, go))
    peer.start()
    try:
        _wait_for(ready)
        wait_timeout = 4.0
        with tunecache.open(db_url, wait_timeout=wait_timeout) as cache:

            def tune(key: Key) -> dict[str, float]:
                assert key.mapping == mine, "the peer's key is the peer's to tune"
                # The behaviour under test, not a wait: our own share outlasts the wait
                # timeout.
                time.sleep(wait_timeout + 0.5)
                # The peer publishes once we have read its key twice after this tune: a
                # wait timed from the call gives up at the first read, and tunes it here.
                waiting = procs.after_reads(cache, 2)
                threading.Thread(target=lambda: waiting.wait(120) and go.write_text("go"),
                                 daemon=True).start()
                return {"my_kernel": 1.0}

            results = cache.get_or_tune_many([mine, theirs], tune)
        peer.join(timeout=60)
        assert peer.exitcode == 0
    finally:
        peer.kill()
    assert [(r.source, r.best) for r in results] == [("tuned", "my_kernel"),
                                                     ("peer", "peer_kernel")]


def test_key_tuned_when_the_database_fails_at_publish_time_is_kept_not_tuned_again(
    db_url, caplog
):
    key = {"kind": "test", "op": "mm", "i": 4}
    calls: list[int] = []

    def tune() -> dict[str, float]:
        calls.append(1)
        # The database fails between the tune and its publish.
        Database(db_url).run(
            lambda c: c.execute(text("ALTER TABLE tunecache_entries RENAME TO moved_away")),
            write=True,
        )
        return {"aten": 2.0, "triton": 1.0}

    with tunecache.open(db_url) as cache, caplog.at_level(logging.WARNING, logger="tunecache"):
        result = cache.get_or_tune(key, tune)
    assert calls == [1]
    assert (result.source, result.best, result.timings) == ("local", "triton",
                                                            {"aten": 2.0, "triton": 1.0})
    assert len([r for r in caplog.records if r.name == "tunecache"]) == 1


def _lease_reader(url: str, key: dict):
    db, h = Database(url), key_hash(key)[0]
    query = select(entries.c.lease_expires_at).where(entries.c.key_hash == h)
    return lambda: db.run(lambda c: c.execute(query).scalar())


_wait_until = procs.wait_until


def test_renewal_in_flight_while_the_owner_publishes_reports_no_lost_claim(pg_url, caplog):
    # SQLite has one write lock, so which of two writers goes first cannot be forced
    # there; PostgreSQL's row locks can hold the heartbeat's renewal back while the owner
    # publishes another of its keys, which is the interleaving behind the false warnings.
    cache = tunecache.open(pg_url, lease_seconds=6.0)  # heartbeat every 2 s
    first, second = {"kind": "test", "i": "first"}, {"kind": "test", "i": "second"}
    h_first = key_hash(first)[0]
    started = {"first": threading.Event(), "second": threading.Event()}
    finish = {"first": threading.Event(), "second": threading.Event()}
    results: dict[str, tunecache.Result] = {}

    def call(name: str, key: dict) -> None:
        def tune() -> dict[str, float]:
            started[name].set()
            finish[name].wait(60)
            return {name: 1.0}

        results[name] = cache.get_or_tune(key, tune)

    threads = {name: threading.Thread(target=call, args=(name, key))
               for name, key in (("first", first), ("second", second))}
    caplog.set_level(logging.WARNING, logger="tunecache")
    for name in ("first", "second"):  # the heartbeat renews them in this order
        threads[name].start()
        assert started[name].wait(60)

    lease_of_first = _lease_reader(pg_url, first)
    with psycopg.connect(pg_url, autocommit=True) as watcher, psycopg.connect(pg_url) as locker:
        locker.execute("SELECT 1 FROM tunecache_entries WHERE key_hash = %s FOR UPDATE",
                       (h_first,))
        _wait_until(lambda: watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE tunecache_entries%%'"
        ).fetchone()[0] == 1, "the heartbeat blocking on the first key")
        finish["second"].set()
        threads["second"].join(60)  # published while the renewal is held back
        before = lease_of_first()
        locker.commit()
    # Two more renewals of the first key: the one held back has been logged by then.
    _wait_until(lambda: lease_of_first() > before, "the held-back renewal")
    renewed = lease_of_first()
    _wait_until(lambda: lease_of_first() > renewed, "the next renewal")
    finish["first"].set()
    threads["first"].join(60)
    cache.close()

    assert (results["first"].source, results["second"].source) == ("tuned", "tuned")
    assert _lost_claims([r.getMessage() for r in caplog.records]) == []


def test_write_stall_within_the_lock_timeout_never_costs_a_live_owner_its_claim(sqlite_url,
                                                                               tmp_path):
    # A writer stalled with the SQLite write lock held (a process frozen inside a
    # transaction) holds back every heartbeat. An owner renews every lease/3 and a
    # renewal waits up to the lock timeout, so the lease outlasts any stall that the lock
    # timeout tolerates only if lock_timeout <= lease/2 (Settings refuses more). Worst
    # case here: the stall starts just before a renewal is due and lasts just under the
    # lock timeout, while a peer waits to take the key over the moment the lease passes.
    lease = 2.0
    lock_timeout = tunecache.Settings.from_env({}, lease_seconds=lease).lock_timeout
    assert lock_timeout == lease / 2
    key = {"kind": "test", "op": "mm", "i": "stalled"}
    started, go = tmp_path / "started", tmp_path / "go"
    queue = ctx.Queue()
    owner = ctx.Process(target=procs.owner_tunes_until,
                        args=(sqlite_url, lease, key, started, go, queue))
    owner.start()
    _wait_for(started)
    peer = ctx.Process(target=procs.owner_tunes_until,
                       args=(sqlite_url, lease, key, tmp_path / "peer_started", go, queue))
    peer.start()
    path = sqlite_url.removeprefix("sqlite:///")
    lease_of = _lease_reader(sqlite_url, key)
    for _ in range(3):
        renewed_at = lease_of()
        _wait_until(lambda renewed_at=renewed_at: lease_of() != renewed_at, "a renewal")
        # The stall is the behaviour under test, not a wait: timed from an observed
        # renewal, it starts about when the next one is due (a later start only makes it
        # easier) and holds the write lock for 90% of the lock timeout.
        time.sleep(lease / 3 - 0.1)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        time.sleep(0.9 * lock_timeout)
        holder.execute("ROLLBACK")
        holder.close()
    go.write_text("go")
    reports = [queue.get(timeout=60) for _ in range(2)]
    for p in (owner, peer):
        p.join(timeout=30)
        assert p.exitcode == 0

    assert sorted(r["source"] for r in reports) == ["peer", "tuned"]
    assert [m for r in reports for m in r["warnings"]] == []
    assert not (tmp_path / "peer_started").exists()
    row = _row(sqlite_url, key)
    assert (row.state, row.token) == ("done", 1)
