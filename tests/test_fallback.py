"""Never break the user's job: every store failure is one warning and a local tune."""

from __future__ import annotations

import logging
import sqlite3

import pytest
from sqlalchemy import text

import tunecache
from tunecache.keys import key_hash
from tunecache.store import Database, ensure_schema

KEY = {"kind": "test", "op": "mm", "i": 1}


def _tuner() -> dict[str, float]:
    return {"aten": 2.0, "triton": 1.0}


def _assert_local_with_one_warning(cache: tunecache.TuneCache, caplog, expect: str) -> None:
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        first = cache.get_or_tune(KEY, _tuner)
        second = cache.get_or_tune_many([KEY, {"other": 1}], lambda key: _tuner())
    assert first.source == "local" and first.best == "triton"
    assert [r.source for r in second] == ["local", "local"]
    warnings = [r for r in caplog.records if r.name == "tunecache"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert expect in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()


def test_unreachable_server_tunes_locally_with_one_warning(caplog):
    cache = tunecache.open("postgresql://tunecache@127.0.0.1:1/nowhere", lock_timeout=2)
    _assert_local_with_one_warning(cache, caplog, "127.0.0.1:1")


def test_garbage_file_as_database_tunes_locally_and_is_left_untouched(tmp_path, caplog):
    garbage = tmp_path / "tune.db"
    payload = b"this is not a database\x00" * 400
    garbage.write_bytes(payload)
    cache = tunecache.open(str(garbage))
    _assert_local_with_one_warning(cache, caplog, "not a database")
    assert garbage.read_bytes() == payload


def test_database_locked_past_the_timeout_tunes_locally(tmp_path, caplog):
    path = tmp_path / "tune.db"
    ensure_schema(Database(f"sqlite:///{path}"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        cache = tunecache.open(str(path), lock_timeout=0.5)
        _assert_local_with_one_warning(cache, caplog, "locked")
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_database_from_a_newer_tunecache_is_refused_and_tunes_locally(db_url, caplog):
    db = Database(db_url)
    ensure_schema(db)
    db.run(lambda c: c.execute(text("UPDATE tunecache_alembic_version SET version_num='9999'")),
           write=True)
    with pytest.raises(tunecache.SchemaTooNewError, match="newer tunecache"):
        ensure_schema(db)
    _assert_local_with_one_warning(tunecache.open(db_url), caplog, "newer tunecache")


def test_malformed_tunecache_db_is_a_one_line_config_error(monkeypatch):
    monkeypatch.setenv("TUNECACHE_DB", "mysql://somewhere/db")
    with pytest.raises(tunecache.ConfigError) as error:
        tunecache.open()
    assert str(error.value) == (
        "TUNECACHE_DB='mysql://somewhere/db' is invalid: expected a sqlite:/// or "
        "postgresql:// URL, not mysql://"
    )


@pytest.mark.parametrize(
    "timings_json",
    [
        '{"aten": -1.0}',
        '{"aten": "fast"}',
        "[1, 2, 3]",
        "{not json",
        "{}",
        '{"' + "x" * 5000 + '": 1.0}',
        # 200 KB, under the size limit, nested past what the JSON parser recurses into.
        '{"x":' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
    ids=["negative", "text", "list", "not-json", "empty", "long-name", "deep"],
)
def test_hostile_entry_is_not_trusted_and_not_overwritten(db_url, caplog, timings_json):
    cache = tunecache.open(db_url)
    cache.get_or_tune(KEY, _tuner)
    h = key_hash(KEY)[0]
    db = cache.store.db
    db.run(lambda c: c.execute(
        text("UPDATE tunecache_entries SET timings_json=:t, best='evil' WHERE key_hash=:h"),
        {"t": timings_json, "h": h}), write=True)

    with caplog.at_level(logging.WARNING, logger="tunecache"):
        result = cache.get_or_tune(KEY, _tuner)
        again = cache.get_or_tune(KEY, _tuner)
    assert (result.source, result.best) == ("local", "triton")
    assert again.source == "local"
    assert cache.lookup(KEY) is None
    assert len([r for r in caplog.records if "invalid tunecache entry" in r.getMessage()]) == 1
    stored = db.run(lambda c: c.execute(
        text("SELECT timings_json FROM tunecache_entries WHERE key_hash=:h"), {"h": h}).scalar())
    assert stored == timings_json
    cache.close()


def test_off_mode_never_touches_the_database(tmp_path):
    path = tmp_path / "never.db"
    cache = tunecache.open(str(path), mode="off")
    assert cache.get_or_tune(KEY, _tuner).source == "local"
    assert not path.exists()
