"""Ctrl-C in the commands that only read (export, prune --dry-run): one line and exit 130,
like the commands that write (tests/test_cli_transfer.py, tests/test_cli_prune.py), never
click's "Aborted!" and exit 1."""

from __future__ import annotations

import signal
import subprocess
import sys

import procs
import pytest
from cli_helpers import gemm_key, populate
from sqlalchemy import create_engine, text

from tunecache.settings import resolve_db_url


def _interrupted_while_the_table_is_locked(url: str, *args: str) -> tuple[int, str, str]:
    """Run ``tunecache ARGS --db URL`` while the test holds the entries table locked, so
    that its reading waits on the lock; SIGINT once PostgreSQL says it waits."""
    engine = create_engine(resolve_db_url(url))
    holder = engine.connect()
    held = holder.begin()
    holder.execute(text("LOCK TABLE tunecache_entries IN ACCESS EXCLUSIVE MODE"))
    proc = subprocess.Popen([sys.executable, "-m", "tunecache.cli", *args, "--db", url],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def waits() -> bool:
        # A connection of its own each time: a transaction sees one snapshot of the
        # statistics.
        with engine.connect() as watcher:
            return watcher.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'")).scalar_one() > 0

    try:
        procs.wait_until(lambda: waits() or proc.poll() is not None,
                         "the command waiting on the lock")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        held.rollback()
        holder.close()
        engine.dispose()
    return proc.returncode, stdout, stderr


@pytest.mark.timeout(300)
def test_ctrl_c_in_an_export_is_one_line_exit_130_and_leaves_no_file(pg_url, tmp_path):
    populate(pg_url, [gemm_key("mm", i) for i in range(3)])
    out = tmp_path / "out.jsonl"
    code, stdout, stderr = _interrupted_while_the_table_is_locked(pg_url, "export", "-o",
                                                                  str(out))
    assert code == 130, (stdout, stderr)
    assert stdout == ""
    assert stderr == (f"interrupted by Ctrl-C: nothing exported; {out} is not written "
                      "(an earlier file there is as it was)\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(300)
def test_ctrl_c_in_an_export_to_stdout_says_the_output_is_incomplete(pg_url):
    populate(pg_url, [gemm_key("mm", i) for i in range(3)])
    code, stdout, stderr = _interrupted_while_the_table_is_locked(pg_url, "export")
    assert code == 130, (stdout, stderr)
    assert stderr == ("interrupted by Ctrl-C: the export on stdout is incomplete; use none "
                      "of it\n")


@pytest.mark.timeout(300)
def test_ctrl_c_in_a_prune_dry_run_is_one_line_exit_130(pg_url):
    populate(pg_url, [gemm_key("mm", i) for i in range(3)])
    code, stdout, stderr = _interrupted_while_the_table_is_locked(
        pg_url, "prune", "--older-than", "0s", "--dry-run")
    assert code == 130, (stdout, stderr)
    assert stdout == ""
    assert stderr == "interrupted by Ctrl-C: a dry run; nothing was deleted\n"
