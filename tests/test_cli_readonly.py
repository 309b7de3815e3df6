"""Commands that only read never create or migrate anything, and nothing creates a
missing directory (but tunecache's own default one).

Reading commands (stats, ls, show, export, doctor, warm --dry-run) and the dry runs of
import and merge open the database read-only: on a missing database they say that it
does not exist (one line, exit 1), on an empty file or an old schema they say to run
`tunecache upgrade` (one line, exit 1), and the file is left as it was.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

import pytest
from cli_helpers import gemm_key, populate, run

import tunecache

DATA = Path(__file__).resolve().parent / "data"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _export_file(tmp_path: Path) -> Path:
    src = tmp_path / "src.db"
    populate(str(src), [gemm_key("mm", 0)])
    path = tmp_path / "x.jsonl"
    assert run("export", "--db", str(src), "-o", str(path)).exit_code == 0
    return path


def test_upgrade_never_creates_a_missing_directory(tmp_path):
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    result = run("upgrade", "--db", str(missing))
    assert result.exit_code == 1
    assert result.stderr == (f"Error: tunecache database sqlite:///{missing}: directory "
                             f"{missing.parent} does not exist; check --db, or create it "
                             "first (`tunecache doctor` checks the setup)\n")
    assert not (tmp_path / "nonexistent").exists()


def test_job_never_creates_a_missing_directory_and_tunes_locally(tmp_path, caplog):
    missing = tmp_path / "typo" / "tune.db"
    with caplog.at_level(logging.WARNING, logger="tunecache"), \
            tunecache.open(str(missing)) as cache:
        result = cache.get_or_tune(gemm_key("mm", 1), lambda: {"aten": 1.0})
    assert result.source == "local"
    assert not missing.parent.exists()
    assert any(f"directory {missing.parent} does not exist" in r.getMessage()
               for r in caplog.records)


def test_job_creates_the_default_database_under_its_own_cache_directory(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TUNECACHE_DB", raising=False)
    with tunecache.open() as cache:
        assert cache.get_or_tune(gemm_key("mm", 1), lambda: {"aten": 1.0}).source == "tuned"
    assert (tmp_path / "xdg" / "tunecache" / "tunecache.db").is_file()


@pytest.mark.parametrize("command", ["import", "merge"])
def test_dry_run_never_creates_the_target(tmp_path, command):
    path = _export_file(tmp_path)
    target = tmp_path / "target.db"
    source = str(path) if command == "import" else str(tmp_path / "src.db")
    args = ([command, source, "--db", str(target), "--dry-run"] if command == "import" else
            [command, source, "--into", str(target), "--dry-run"])
    result = run(*args)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (f"Error: tunecache database sqlite:///{target}: no database file "
                             "there, and a dry run creates nothing; run it without --dry-run "
                             "to create it, or check --db or TUNECACHE_DB (`tunecache doctor` "
                             "checks the setup)\n")
    assert not target.exists()


def test_failed_import_of_a_file_that_is_not_an_export_creates_nothing(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text('{"x": 1}\n')
    target = tmp_path / "target.db"
    result = run("import", str(bad), "--db", str(target))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {bad}: line 1 is not a tunecache export header")
    assert result.stderr.count("\n") == 1
    assert not target.exists()


READING = [["stats"], ["ls"], ["ls", "--graphs"], ["show", "abcd"], ["export"],
           ["warm", "--dry-run"]]


@pytest.mark.parametrize("command", READING, ids=" ".join)
def test_reading_command_on_an_empty_file_says_run_upgrade_and_leaves_it_empty(tmp_path,
                                                                               command):
    empty = tmp_path / "empty.db"
    empty.touch()
    result = run(*command, "--db", str(empty))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (f"Error: tunecache database sqlite:///{empty} has no tunecache "
                             "schema yet; run `tunecache upgrade` to create it\n")
    assert empty.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


@pytest.mark.parametrize("command", READING, ids=" ".join)
def test_reading_command_on_an_old_schema_says_run_upgrade_and_migrates_nothing(tmp_path,
                                                                                command):
    old = tmp_path / "old.db"
    shutil.copy(DATA / "schema-0003.db", old)
    before = _digest(old)
    result = run(*command, "--db", str(old))
    assert result.exit_code == 1
    assert result.stderr == (f"Error: tunecache database sqlite:///{old} is at schema revision "
                             "'0003', older than this tunecache; run `tunecache upgrade`\n")
    assert _digest(old) == before


@pytest.mark.parametrize("command", [*READING, ["doctor"]], ids=" ".join)
def test_reading_command_on_a_missing_database_creates_nothing(tmp_path, command):
    missing = tmp_path / "missing.db"
    result = run(*command, "--db", str(missing))
    # doctor reports a database not created yet as a warning (jobs create it), the
    # others fail in one line
    assert result.exit_code == (0 if command == ["doctor"] else 1)
    assert list(tmp_path.iterdir()) == []


def test_directory_as_db_is_named_a_directory(tmp_path):
    export = _export_file(tmp_path)
    for command in (["stats"], ["upgrade"], ["import", str(export)]):
        result = run(*command, "--db", str(tmp_path))
        assert result.exit_code == 1, command
        assert result.stderr == (f"Error: tunecache database sqlite:///{tmp_path}: this is a "
                                 "directory, not a database file; name a file in it, e.g. "
                                 f"{tmp_path}/tunecache.db (`tunecache doctor` checks the "
                                 "setup)\n"), command
