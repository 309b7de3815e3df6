"""PostgreSQL's limits: a lock held by a frozen or foreign session, and a server with fewer
connection slots than processes (as at cluster scale). Real processes, the real server."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import procs
import psycopg
import pytest
from conftest import PG_ADMIN_URL
from sqlalchemy import event
from sqlalchemy.engine import make_url
from test_concurrency import _gather

import tunecache
from tunecache.keys import Key
from tunecache.store import Claim
from tunecache.store.notify import NOTIFY_CHANNEL

ctx = mp.get_context("fork")

KEY = {"kind": "test", "op": "mm", "i": 0}


def _timings(key: dict[str, Any]) -> dict[str, float]:
    return {"aten": 1.0 + int(key["i"]) % 3 * 0.1, "triton": 1.15}


def _admin() -> psycopg.Connection:
    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)


def _report(queue: Any, result: tunecache.Result, started: float) -> None:
    queue.put({"pid": os.getpid(), "source": result.source, "timings": result.timings,
               "seconds": time.monotonic() - started})


def _freeze_inside_claim(url: str, lock_timeout: float, frozen: Path, queue: Any) -> None:
    """Claim KEY and stop this process (SIGSTOP) inside the claim's transaction, right after
    the INSERT that claims it, before the COMMIT; the test resumes it later."""
    cache = tunecache.open(url, lock_timeout=lock_timeout)

    def stop_after_claim_insert(_conn, _cursor, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO TUNECACHE_ENTRIES"):
            frozen.write_text(str(os.getpid()))  # not the queue: its feeder thread stops too
            os.kill(os.getpid(), signal.SIGSTOP)

    event.listen(cache.store.db.engine, "after_cursor_execute", stop_after_claim_insert)
    started = time.monotonic()
    _report(queue, cache.get_or_tune(KEY, lambda: {"frozen_owner": 0.5}), started)
    cache.close()


def _get(url: str, lock_timeout: float, queue: Any) -> None:
    cache = tunecache.open(url, lock_timeout=lock_timeout)
    started = time.monotonic()
    _report(queue, cache.get_or_tune(KEY, lambda: _timings(KEY)), started)
    cache.close()


def _next(queue: Any, timeout: float) -> dict[str, Any] | None:
    try:
        return queue.get(timeout=timeout)
    except Empty:
        return None


def test_peer_of_a_process_frozen_inside_its_claim_transaction_is_not_blocked(pg_url, tmp_path):
    # Before: the peer's claim waited on the frozen transaction's row lock until the owner
    # was resumed, whatever TUNECACHE_LOCK_TIMEOUT said. Now the server ends the frozen
    # session (idle in transaction past half the lock timeout), the peer claims the key,
    # and the owner, once resumed, takes the peer's result instead of tuning its own.
    lock_timeout = 6.0
    tunecache.open(pg_url).lookup(KEY)  # migrate before the race
    queue = ctx.Queue()
    frozen = tmp_path / "frozen"
    owner = ctx.Process(target=_freeze_inside_claim, args=(pg_url, lock_timeout, frozen, queue))
    owner.start()
    peer = None
    try:
        procs.wait_until(lambda: frozen.exists() and frozen.read_text() == str(owner.pid),
                         "the owner reaching its claim")
        peer = ctx.Process(target=_get, args=(pg_url, lock_timeout, queue))
        peer.start()
        # Generous: a claim may wait lock_timeout for a lock, then fall back; far below
        # "forever", which is what the peer waited before.
        got = _next(queue, 10 * lock_timeout + 30)
        assert got is not None, "the peer stayed blocked behind the frozen owner"
        assert got["pid"] == peer.pid
        assert got["source"] == "tuned" and got["timings"] == _timings(KEY)
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    resumed = _next(queue, 60)
    assert resumed is not None and resumed["pid"] == owner.pid
    assert resumed["source"] == "hit" and resumed["timings"] == _timings(KEY)
    for p in (owner, peer):
        p.join(timeout=30)
        assert p.exitcode == 0


def test_claim_behind_a_foreign_lock_falls_back_after_the_lock_timeout(pg_url, caplog):
    # A session that is not tunecache's (an operator's psql, say) holds the table in an
    # open transaction: no timeout of ours can end it, so the claim gives up after
    # TUNECACHE_LOCK_TIMEOUT, warns once, and tunes locally.
    lock_timeout = 2.0
    cache = tunecache.open(pg_url, lock_timeout=lock_timeout)
    cache.lookup(KEY)  # migrate, and check the schema, before the lock is taken
    outcome: list[tunecache.Result] = []
    with psycopg.connect(pg_url, connect_timeout=5) as holder:
        holder.execute("LOCK TABLE tunecache_entries IN ACCESS EXCLUSIVE MODE")
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            worker = threading.Thread(
                target=lambda: outcome.append(cache.get_or_tune(KEY, lambda: _timings(KEY))),
                daemon=True,
            )
            worker.start()
            worker.join(timeout=10 * lock_timeout + 30)
            stuck = worker.is_alive()
        holder.rollback()
    worker.join(timeout=60)
    assert not stuck, "the claim waited on the lock past TUNECACHE_LOCK_TIMEOUT"
    assert outcome[0].source == "local" and outcome[0].timings == _timings(KEY)
    warnings = [r.getMessage() for r in caplog.records if r.name == "tunecache"]
    assert len(warnings) == 1 and "TUNECACHE_LOCK_TIMEOUT" in warnings[0], warnings
    cache.close()


def _connections(url: str) -> int:
    """Sessions on the database of ``url``, not counting the one that asks."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        (n,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()
    return n


def _listening(url: str) -> int:
    """Sessions on the database of ``url`` that LISTEN for published keys: a waiter's."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        (n,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = %s", (f"LISTEN {NOTIFY_CHANNEL}",)).fetchone()
    return n


def test_processes_hold_no_connection_between_calls_not_even_after_waiting(pg_url):
    # Before: pooled connections per process for its life, and a waiter's LISTEN
    # connection from its first wait to the end of the process.
    owner, waiter = tunecache.open(pg_url), tunecache.open(pg_url)
    assert owner.lookup(KEY) is None
    claim = owner.claim(KEY)
    assert isinstance(claim, Claim)
    got: list[tunecache.Result] = []
    thread = threading.Thread(target=lambda: got.append(
        waiter.get_or_tune(KEY, lambda: pytest.fail("the owner's claim is live"))))
    thread.start()
    # The server shows the waiter asleep on LISTEN (its polls reach the 0.1 s that is worth
    # a connection within a few tens of ms); only then does the owner publish.
    procs.wait_until(lambda: _listening(pg_url) == 1, "the waiter listening")
    assert owner.publish(claim, _timings(KEY)) is not None
    thread.join(timeout=60)
    assert got and got[0].source == "peer" and got[0].timings == _timings(KEY)
    # A connection outlives a transaction by a tenth of a second (a burst of lookups).
    procs.wait_until(lambda: _connections(pg_url) == 0, "connections closed after the calls",
                     timeout=30)
    owner.close()
    waiter.close()


@pytest.fixture
def limited_pg_url(pg_url) -> Iterator[str]:
    """pg_url owned by a new non-superuser role, at CONNECTION LIMIT 8 (superusers are
    exempt from a database's limit), migrated beforehand."""
    database = make_url(pg_url).database
    role = f"tunecache_limited_{uuid.uuid4().hex[:8]}"
    with _admin() as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'ALTER DATABASE "{database}" OWNER TO "{role}"')
    url = make_url(pg_url).set(username=role).render_as_string(hide_password=False)
    cache = tunecache.open(url)
    cache.lookup(KEY)
    cache.close()
    with _admin() as admin:
        admin.execute(f'ALTER DATABASE "{database}" CONNECTION LIMIT 8')
    try:
        yield url
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def _share(url: str, n_keys: int, barrier: Any, queue: Any) -> None:
    # The lock timeout bounds a wait for a connection slot too; on 2 loaded cores, a
    # transaction of 40 processes has waited seconds for one of 8 slots: 30 s is a margin.
    cache = tunecache.open(url, lease_seconds=60, lock_timeout=30)
    tuned: list[int] = []

    def tune(key: Key) -> dict[str, float]:
        tuned.append(key.mapping["i"])
        time.sleep(0.05)  # a tuner that takes time: the behaviour, not a wait
        return _timings(key.mapping)

    barrier.wait()
    results = cache.get_or_tune_many([{**KEY, "i": i} for i in range(n_keys)], tune)
    queue.put({"pid": os.getpid(), "tuned": tuned, "sources": [r.source for r in results],
               "results": [(r.key_hash, sorted(r.timings.items())) for r in results]})
    cache.close()


@pytest.mark.slow
def test_40_processes_on_8_connection_slots_tune_each_key_once_and_share_every_result(
    limited_pg_url,
):
    # Before: each process held pooled connections for its life; those past the limit got
    # "too many connections", tuned every key locally and kept their own winners.
    n_procs, n_keys = 40, 20
    reports = _gather(_share, n_procs, (limited_pg_url, n_keys), timeout=300)

    assert sorted(i for r in reports for i in r["tuned"]) == list(range(n_keys))
    assert all(set(r["sources"]) <= {"tuned", "peer", "hit"} for r in reports), \
        [r["sources"] for r in reports if "local" in r["sources"]][:3]
    assert all(r["results"] == reports[0]["results"] for r in reports)


def test_no_free_connection_slot_within_the_lock_timeout_tunes_locally_with_one_warning(
    limited_pg_url, caplog
):
    # Before: the first refused connect was the end of the cache for that process.
    lock_timeout = 2.0
    with _admin() as admin:
        admin.execute(f'ALTER DATABASE "{make_url(limited_pg_url).database}" CONNECTION LIMIT 0')
    cache = tunecache.open(limited_pg_url, lock_timeout=lock_timeout)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        result = cache.get_or_tune(KEY, lambda: _timings(KEY))
    assert time.monotonic() - started >= lock_timeout  # it waited for a slot first
    assert result.source == "local" and result.timings == _timings(KEY)
    warnings = [r.getMessage() for r in caplog.records if r.name == "tunecache"]
    assert len(warnings) == 1 and "no free connection slot" in warnings[0], warnings
    cache.close()
