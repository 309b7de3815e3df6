"""Process bodies for the multi-process tests (module-level, so any start method works),
and the helpers that synchronise a test with them.

Each reports through a queue as a plain dict; each builds its own TuneCache after the fork.
Nothing here synchronises by sleeping: a process waits for a file, a row or a statement
that another one produces, with a bound that only guards against a hang.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, select

import tunecache
from tunecache.keys import Key
from tunecache.store import Claim
from tunecache.store.schema import entries


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 120) -> None:
    """Poll ``predicate`` until it holds: for state another process or thread changes (a
    file, a row). ``timeout`` only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:g}s"
        time.sleep(0.02)


def file_barrier(directory: Path, name: object, parties: int, timeout: float = 300) -> None:
    """Mark ``directory``/ready-<name>, then wait until all ``parties`` have: processes
    that start together, like ranks after a barrier, however long each took to get here."""
    (directory / f"ready-{name}").touch()
    wait_until(lambda: len(list(directory.glob("ready-*"))) >= parties,
               f"{parties} processes at the barrier in {directory}", timeout)


def after_reads(cache: tunecache.TuneCache, n: int) -> threading.Event:
    """Set once the calling thread has read the entries table ``n`` more times through
    ``cache``'s engine. A waiter only reads while it waits, so its first read after a step
    saw a peer's claim live, and a second one means it is waiting on it: how a test makes a
    peer publish during a wait rather than after a sleep of a guessed length. (A listener
    on SQLAlchemy's public events; the product has no hook for this.)"""
    done, thread, seen = threading.Event(), threading.get_ident(), [0]

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if (threading.get_ident() == thread and "tunecache_entries" in statement
                and statement.lstrip().upper().startswith("SELECT")):
            seen[0] += 1
            if seen[0] >= n:
                done.set()

    event.listen(cache.store.db.engine, "after_cursor_execute", count)
    return done


def keys(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"kind": "test", "op": "mm", "i": i, **extra} for i in range(n)]


def timings_for(key: dict[str, Any]) -> dict[str, float]:
    """Deterministic per key, so every process would agree even without the cache."""
    i = int(key.get("i", 0))
    return {"aten": 1.0 + (i % 5) * 0.1, "triton_a": 1.2 - (i % 3) * 0.1, "triton_b": 1.25}


def share_keys(url: str, n_keys: int, tune_seconds: float, barrier: Any, queue: Any) -> None:
    """All processes ask for the same keys at once; report what each tuned."""
    warnings = _Warnings()
    logging.getLogger("tunecache").addHandler(warnings)
    # No owner dies here, so a long lease costs nothing, and its lock timeout (half of it)
    # outlasts the write-lock waits of 16 processes sharing two busy cores: at a 10 s
    # lease (5 s), some processes gave up on the store and tuned every key locally.
    cache = tunecache.open(url, lease_seconds=60)
    tuned_here: list[int] = []
    claims_held: list[int] = []
    mine = entries.c.owner.like(f"%:{os.getpid()}:%")

    def tune(key: Key) -> dict[str, float]:
        tuned_here.append(key.mapping["i"])
        held = select(func.count()).where(mine, entries.c.state == "claimed")
        claims_held.append(cache.store.db.run(lambda conn: conn.execute(held).scalar_one()))
        time.sleep(tune_seconds)  # a tuner that takes time: the behaviour, not a wait
        return timings_for(key.mapping)

    cache.lookup({"warm": "up"})  # connect and migrate before the race starts
    barrier.wait()
    results = cache.get_or_tune_many(keys(n_keys), tune)
    queue.put({
        "pid": os.getpid(),
        "tuned": tuned_here,
        "claims_held": claims_held,
        "sources": [r.source for r in results],
        "results": [(r.key_hash, r.best, sorted(r.timings.items())) for r in results],
        "warnings": warnings.messages,
    })
    cache.close()


def hold_claim_forever(url: str, lease: float, ready: Path) -> None:
    """Claim one key and never finish tuning it (the test kills or stops us)."""
    cache = tunecache.open(url, lease_seconds=lease)

    def tune() -> dict[str, float]:
        ready.write_text(str(os.getpid()))
        threading.Event().wait()  # forever
        raise AssertionError("unreachable")

    cache.get_or_tune({"kind": "test", "op": "mm", "i": 0}, tune)


def publish_after_stop(url: str, lease: float, ready: Path, go: Path, queue: Any) -> None:
    """Claim key 0 and tune it slowly; the test freezes us past the lease meanwhile."""
    logging.basicConfig(level=logging.WARNING)
    cache = tunecache.open(url, lease_seconds=lease)

    def tune() -> dict[str, float]:
        ready.write_text(str(os.getpid()))
        wait_until(go.exists, "the test's go-ahead")
        return {"stale_owner_kernel": 0.5}

    result = cache.get_or_tune({"kind": "test", "op": "mm", "i": 0}, tune)
    queue.put({"source": result.source, "timings": result.timings, "best": result.best})
    cache.close()


def crash_while_tuning(url: str, lease: float, max_attempts: int) -> None:
    """A poison key: its tuner takes the whole process down."""
    cache = tunecache.open(url, lease_seconds=lease, max_attempts=max_attempts)

    def tune() -> dict[str, float]:
        os._exit(17)

    cache.get_or_tune({"kind": "test", "op": "mm", "poison": True}, tune)


def open_and_report(url: str, barrier: Any, queue: Any) -> None:
    """Open a fresh database together with many others; say whether we migrated it."""
    from tunecache.store import Database, ensure_schema
    from tunecache.store.migrate import current_revision

    db = Database(url, lock_timeout=60)
    barrier.wait()
    try:
        migrated = ensure_schema(db)
        queue.put({"migrated": migrated, "revision": db.run(current_revision)})
    except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
        queue.put({"error": repr(e)})


class _Warnings(logging.Handler):
    """Collects the tunecache logger's warnings in a worker, to report them to the test."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def cheap_then_slow_keys(url: str, lease: float, n_cheap: int, n_slow: int, slow_seconds: float,
                         barrier: Any, queue: Any) -> None:
    """Instant keys first (so claims are batched), then slow ones; report what we tuned."""
    warnings = _Warnings()
    logging.getLogger("tunecache").addHandler(warnings)
    cache = tunecache.open(url, lease_seconds=lease)
    tuned_here: list[int] = []

    def tune(key: Key) -> dict[str, float]:
        tuned_here.append(key.mapping["i"])
        if key.mapping["i"] >= n_cheap:
            time.sleep(slow_seconds)  # a slow tune outlasting the lease: the behaviour
        return timings_for(key.mapping)

    cache.lookup({"warm": "up"})
    barrier.wait()
    results = cache.get_or_tune_many(keys(n_cheap + n_slow), tune)
    queue.put({
        "tuned": tuned_here,
        "sources": [r.source for r in results],
        "results": [(r.key_hash, r.best, sorted(r.timings.items())) for r in results],
        "warnings": warnings.messages,
    })
    cache.close()


def publish_when_told(url: str, mine: dict[str, Any], ready: Path, go: Path) -> None:
    """Claim ``mine``, mark ``ready``, and publish it once ``go`` appears."""
    cache = tunecache.open(url, lease_seconds=600)  # live until we publish, however slow
    claim = cache.claim(mine)
    assert isinstance(claim, Claim), claim
    ready.write_text(str(os.getpid()))
    wait_until(go.exists, "the test's go-ahead")
    assert cache.publish(claim, {"peer_kernel": 0.5}) is not None
    cache.close()


def owner_tunes_until(url: str, lease: float, key: dict[str, Any], started: Path, go: Path,
                      queue: Any) -> None:
    """Claim ``key`` and tune it until ``go`` appears (only the heartbeat keeps the claim)."""
    warnings = _Warnings()
    logging.getLogger("tunecache").addHandler(warnings)
    cache = tunecache.open(url, lease_seconds=lease)

    def tune() -> dict[str, float]:
        started.write_text(str(os.getpid()))
        wait_until(go.exists, "the test's go-ahead")
        return {"owner_kernel": 0.5}

    result = cache.get_or_tune(key, tune)
    queue.put({"source": result.source, "best": result.best, "warnings": warnings.messages})
    cache.close()
