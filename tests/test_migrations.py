"""Alembic: the migrated schema is the declared one, and migrations ship in the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

import tunecache
from tunecache.store import Database, ensure_schema
from tunecache.store.migrate import (
    VERSION_TABLE,
    _config,
    current_revision,
    head_revision,
    known_revisions,
)
from tunecache.store.schema import metadata

ROOT = Path(__file__).resolve().parents[1]
# One SQLite file per past schema revision, frozen with entries written at that revision.
FROZEN = sorted((ROOT / "tests" / "data").glob("schema-*.db"))


def test_migrated_schema_equals_the_declared_schema(db_url):
    db = Database(db_url)
    assert ensure_schema(db) is True
    assert ensure_schema(db) is False

    def diff(conn):
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "version_table": VERSION_TABLE}
        )
        return compare_metadata(context, metadata)

    assert db.run(diff) == []


@pytest.mark.parametrize("frozen", FROZEN, ids=[p.stem for p in FROZEN])
def test_database_of_every_past_schema_upgrades_and_keeps_its_entries(frozen, tmp_path):
    path = tmp_path / frozen.name
    shutil.copyfile(frozen, path)
    with tunecache.open(str(path)) as cache:
        hit = cache.get_or_tune(
            {"kind": "gemm", "op": "mm", "i": 1,
             "env": {"device": "cpu-frozen", "torch": "2.13.0", "triton": "none"}},
            lambda: pytest.fail("an entry of the old schema is a hit after the upgrade"),
        )
        db = cache.store.db
        assert db.run(current_revision) == head_revision()
    assert (hit.source, hit.best, hit.timings) == ("hit", "aten", {"aten": 1.0, "cpp": 3.0})
    assert len(FROZEN) == len(known_revisions()) - 1, "freeze a file for every past revision"


def test_installed_wheel_migrates_without_the_source_tree(tmp_path):
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(ROOT)],
        check=True,
    )
    [wheel] = wheels.glob("tunecache-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
         str(wheel)],
        check=True,
    )
    script = (
        "import tunecache, sys; c = tunecache.open(sys.argv[1]);"
        "print(c.get_or_tune({'i': 1}, lambda: {'a': 1.0}).source, tunecache.__file__);"
        "from tunecache.store.migrate import current_revision;"
        "print(c.store.db.run(current_revision))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "wheel.db")],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()
    assert out[0] == "tuned"
    assert out[1].startswith(str(site))
    # The wheel migrated to the head of the source tree's Alembic scripts, read from them
    # here (a literal "0003" was a second source of the schema version).
    assert out[2] == ScriptDirectory(str(ROOT / "migrations")).get_current_head()


def _indexes(db):
    return {ix["name"] for ix in db.run(lambda c: inspect(c).get_indexes("tunecache_entries"))}


def _migrate(db, to, step):
    def work(conn):
        cfg = _config()
        cfg.attributes["connection"] = conn
        step(cfg, to)

    db.run(work, write=True)


def test_0003_drops_the_last_used_index_and_downgrade_restores_it(db_url):
    """Migration 0003: no query used ix_tunecache_entries_last_used_at (prune filters on
    coalesce(last_used_at, updated_at)), and every prune batch rewrote its pages."""
    db = Database(db_url)
    ensure_schema(db)
    assert "ix_tunecache_entries_last_used_at" not in _indexes(db)
    assert "ix_tunecache_entries_stats" in _indexes(db)

    _migrate(db, "0002", command.downgrade)
    assert db.run(current_revision) == "0002"
    assert "ix_tunecache_entries_last_used_at" in _indexes(db)

    _migrate(db, "head", command.upgrade)
    assert db.run(current_revision) == head_revision()
    assert "ix_tunecache_entries_last_used_at" not in _indexes(db)
    db.dispose()


def test_head_read_from_the_scripts_without_alembic_is_alembics_head():
    from tunecache.store.migrate import _linear_head, _scripts

    assert _linear_head() == _scripts().get_current_head()


def test_0004_adds_the_compiled_graphs_table_and_downgrade_drops_it(db_url):
    """Migration 0004: tunecache_artifacts; on PostgreSQL its payload is stored out of
    line and not compressed again (it comes compressed)."""
    db = Database(db_url)
    ensure_schema(db)

    def tables(conn):
        return set(inspect(conn).get_table_names())

    assert "tunecache_artifacts" in db.run(tables)
    if db.dialect == "postgresql":
        storage = db.run(lambda c: c.execute(text(
            "SELECT attstorage FROM pg_attribute WHERE attrelid = "
            "'tunecache_artifacts'::regclass AND attname = 'payload'")).scalar_one())
        assert storage == "e"
    _migrate(db, "0003", command.downgrade)
    assert "tunecache_artifacts" not in db.run(tables)
    _migrate(db, "head", command.upgrade)
    assert "tunecache_artifacts" in db.run(tables)
    db.dispose()
