"""Every value read from shared storage is untrusted, columns included (whoever can write
the database can put anything there): a wrong-typed column never raises in the caller, and
a row that no process will finish (a state this tunecache does not know, a claim whose
lease is not a number) is tuned locally at once, with one warning, instead of being
waited for."""

from __future__ import annotations

import logging
import math

import pytest
from sqlalchemy import text

import tunecache
from tunecache.keys import key_hash
from tunecache.store import Claim

KEY = {"kind": "test", "op": "mm", "i": 7}


def _tuner() -> dict[str, float]:
    return {"aten": 2.0, "triton": 1.0}


def _set(cache: tunecache.TuneCache, **columns) -> None:
    assignments = ", ".join(f"{name} = :{name}" for name in columns)
    cache.store.db.run(lambda c: c.execute(
        text(f"UPDATE tunecache_entries SET {assignments} WHERE key_hash = :h"),
        {**columns, "h": key_hash(KEY)[0]},
    ), write=True)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tunecache"]


def _text_in_a_typed_column(value: object) -> bool:
    if isinstance(value, dict):
        return any(isinstance(v, str) for k, v in value.items() if k != "state")
    return isinstance(value, str)


def _cases(values: list, ids: list[str]) -> list:
    """(backend, value) pairs. Text in a typed column exists only on SQLite, which keeps
    text it cannot read as a number; PostgreSQL's typed columns refuse it."""
    return [pytest.param(backend, value, id=f"{backend}-{name}")
            for backend in ("sqlite", "postgresql") for value, name in zip(values, ids)
            if backend == "sqlite" or not _text_in_a_typed_column(value)]


def _db(request, backend: str) -> str:
    return request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")


@pytest.mark.parametrize("backend,tune_seconds",
                         _cases(["slow", -5.0, math.inf, math.nan], ["text", "negative", "inf", "nan"]))
def test_tune_seconds_that_is_not_a_duration_is_ignored(request, backend, tune_seconds):
    db_url = _db(request, backend)
    with tunecache.open(db_url) as cache:
        cache.get_or_tune(KEY, _tuner)
        _set(cache, tune_seconds=tune_seconds)
        hit = cache.get_or_tune(KEY, lambda: pytest.fail("a hit is not tuned"))
        cache.flush_usage()
        saved = cache.store.db.run(lambda c: c.execute(
            text("SELECT seconds_saved FROM tunecache_usage ORDER BY id DESC")).first()[0])
    assert (hit.source, hit.best, hit.tune_seconds) == ("hit", "triton", None)
    assert saved == 0.0


def _claimed_by_a_peer(cache: tunecache.TuneCache) -> None:
    with tunecache.open(cache.store.db.url) as peer:
        assert isinstance(peer.claim(KEY), Claim)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "backend,columns",
    _cases(
        [
            {"state": "pending_v2"},  # as a newer tunecache might write
            {"lease_expires_at": math.nan},  # NULL on SQLite, NaN on PostgreSQL
            {"lease_expires_at": math.inf},
            {"lease_expires_at": "soon"},
            {"token": "abc"},
        ],
        ["unknown-state", "nan-lease", "infinite-lease", "text-lease", "text-token"],
    ),
)
def test_row_that_nobody_will_finish_is_tuned_locally_at_once_with_one_warning(
    request, caplog, backend, columns
):
    db_url = _db(request, backend)
    # Waiting out the wait timeout would fail the test through its timeout marker.
    with tunecache.open(db_url, wait_timeout=600) as cache:
        _claimed_by_a_peer(cache)
        _set(cache, **columns)
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            first = cache.get_or_tune(KEY, _tuner)
            many = cache.get_or_tune_many([KEY, {"other": 1}], lambda key: _tuner())
            answer = cache.claim(KEY, wait=600)
            busy = cache.in_progress(KEY)
    assert (first.source, first.best) == ("local", "triton")
    assert [r.source for r in many] == ["local", "tuned"]
    assert (answer, busy) == (None, False)
    [warning] = _warnings(caplog)
    assert key_hash(KEY)[0][:16] in warning and "\n" not in warning
