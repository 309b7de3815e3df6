"""A part of Triton sharing that fails: one warning per part, then Inductor's own path
(TritonCache.attempt, the guard around each such part)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import tunecache
from tunecache.inductor.triton import TritonCache
from tunecache.inductor.triton.signals import NoLongerWanted


def _raising(error: BaseException) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise error

    return call


@pytest.fixture
def state() -> TritonCache:
    tunecache.reset_stats()
    return TritonCache(_raising(RuntimeError("no database")))


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_failing_read_is_a_miss_warned_of_once(state, caplog, monkeypatch):
    monkeypatch.setattr(state, "_get", _raising(RuntimeError("database gone")))
    with caplog.at_level(logging.DEBUG, logger="tunecache"):
        assert state.get("inductor key", "key text") is None
        assert state.get("inductor key", "key text") is None
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "reading a Triton kernel's best config failed (RuntimeError: database gone)" \
        in warnings[0]
    assert any("failed again" in line for line in _lines(caplog, logging.DEBUG))
    assert tunecache.stats().triton.as_dict()["errors"] == 2


def test_failing_publishes_and_releases_never_raise(state, caplog, monkeypatch):
    monkeypatch.setattr(state, "_put", _raising(OSError("disk full")))
    monkeypatch.setattr(state, "_release", _raising(ValueError("bad claim")))
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        state.put("inductor key", "key text", {"num_warps": 4})
        state.release_claim("inductor key", "key text", "tuning failed")
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 2
    assert "publishing a Triton kernel's best config failed (OSError: disk full)" \
        in warnings[0]
    assert "giving back a Triton kernel's claim failed (ValueError: bad claim)" in warnings[1]


@pytest.mark.parametrize("error", [NoLongerWanted(), KeyboardInterrupt()])
def test_a_base_exception_goes_through(state, caplog, monkeypatch, error):
    monkeypatch.setattr(state, "_get", _raising(error))
    with caplog.at_level(logging.WARNING, logger="tunecache"), \
            pytest.raises(type(error)):
        state.get("inductor key", "key text")
    assert not _lines(caplog, logging.WARNING)
    assert tunecache.stats().triton.as_dict()["errors"] == 0


def test_the_attempt_records_its_failure(state):
    with state.attempt("reading something") as fine:
        pass
    assert not fine.failed and fine.failure == ""
    with state.attempt("reading something") as failing:
        raise LookupError("not there")
    assert failing.failed and failing.failure == "LookupError: not there"
