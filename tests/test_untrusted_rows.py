"""Every value read from shared storage is untrusted, columns included (whoever can write
the database can put anything there): a wrong-typed column never raises in the caller, and
a row that no process will finish (a state this tunecache does not know, a claim whose
token is not a number) is tuned locally at once, with one warning, instead of being waited
for; a claim whose lease no honest owner could have set (absurdly far ahead, not a number)
is taken over at once."""

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
                         _cases(["slow", -5.0, math.inf, math.nan],
                                ["text", "negative", "inf", "nan"]))
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
            {"token": "abc"},
        ],
        # A lease that is no number is taken over instead: the tests of absurd leases.
        ["unknown-state", "text-token"],
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


def _token(cache: tunecache.TuneCache) -> int:
    return cache.store.db.run(lambda c: c.execute(
        text("SELECT token FROM tunecache_entries WHERE key_hash = :h"),
        {"h": key_hash(KEY)[0]}).scalar_one())


# A lease no honest owner could have set: further ahead than the longest lease the settings
# allow plus the clock-skew slack (tunecache.settings.IMPLAUSIBLE_LEASE_SECONDS), or no
# finite number at all.
_ABSURD_LEASES = _cases(
    [{"lease_expires_at": 1e300}, {"lease_expires_at": "far-future-1e300"},
     {"lease_expires_at": 4e9 * 1000}, {"lease_expires_at": math.inf},
     {"lease_expires_at": math.nan}, {"lease_expires_at": -1e300},
     {"lease_expires_at": "soon"}, {"lease_expires_at": None}],
    ["1e300", "1e300-text", "year-125k", "inf", "nan", "negative", "text", "null"],
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend,columns", _ABSURD_LEASES)
def test_claim_with_an_absurd_lease_is_taken_over_at_once_not_waited_for(
    request, backend, columns
):
    db_url = _db(request, backend)
    # A short wait timeout only as a guard: a regression waits it out, tunes locally and
    # fails the assertions below instead of hanging for 900 s.
    with tunecache.open(db_url, wait_timeout=5) as cache:
        _claimed_by_a_peer(cache)
        _set(cache, **columns)
        got = cache.get_or_tune(KEY, _tuner)
        assert (got.source, got.best) == ("tuned", "triton")
        assert _token(cache) == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend,columns", _ABSURD_LEASES)
def test_claim_api_takes_over_a_claim_with_an_absurd_lease(request, backend, columns):
    db_url = _db(request, backend)
    with tunecache.open(db_url, wait_timeout=5) as cache:
        _claimed_by_a_peer(cache)
        _set(cache, **columns)
        assert not cache.in_progress(KEY)
        claim = cache.claim(KEY, wait=5)
        assert isinstance(claim, Claim) and claim.token == 2
        assert cache.publish(claim, _tuner()).source == "tuned"


def test_the_longest_honest_lease_is_waited_for(db_url):
    """The bound lets through every lease the settings allow: a claim renewed with the
    longest of them is a live claim, not taken over."""
    from tunecache.settings import MAX_LEASE_SECONDS

    with tunecache.open(db_url, wait_timeout=5) as cache:
        with tunecache.open(db_url, lease_seconds=MAX_LEASE_SECONDS,
                            lock_timeout=1) as peer:
            assert isinstance(peer.claim(KEY), Claim)
        assert cache.in_progress(KEY)
        assert cache.claim(KEY, wait=0) is None
        assert _token(cache) == 1
