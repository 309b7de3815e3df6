"""tools/demo.py (`make demo`): Ctrl-C or SIGTERM ends it in one line, its temporary
directory and job processes gone; its last line states the run's result; the database it
keeps and the commands it prints work as printed."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import procs
import pytest
from cli_helpers import run
from tool_modules import TOOLS, load_tool

DEMO = TOOLS / "demo.py"
demo = load_tool("demo")


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT's default action in the demo, as a terminal's shell starts it: a test run in
    the background (``nohup make test &``) passes SIGINT on ignored, and a Python started
    with SIGINT ignored never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _processes_naming(text: str) -> list[int]:
    """The processes whose command line names ``text`` (the demo's job processes name files
    in its temporary directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        if text in cmdline:
            found.append(int(entry.name))
    return found


def _stop_the_demo_once_its_first_job_process_started(signum: int) -> tuple[
        subprocess.Popen[str], str, str, Path]:
    """The demo is signalled once its first job process has started (still importing
    torch, long before any compile)."""
    proc = subprocess.Popen([sys.executable, str(DEMO), "--procs", "1", "--rounds", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        first = proc.stdout.readline()
        tmp = Path(re.search(r" in (\S+) \(removed at the end\)", first).group(1))
        procs.wait_until(lambda: any(tmp.glob("*-round1-0.log")) or proc.poll() is not None,
                         "the first job process started")
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, stdout, stderr, tmp


@pytest.mark.timeout(120)
def test_ctrl_c_ends_the_demo_in_one_line_with_exit_130_and_removes_its_temporary_directory():
    proc, stdout, stderr, tmp = _stop_the_demo_once_its_first_job_process_started(signal.SIGINT)
    assert proc.returncode == 130, (stdout, stderr)
    assert stdout.splitlines()[-1] == f"interrupted: the demo stopped (Ctrl-C); removed {tmp}"
    assert stderr == ""
    assert not tmp.exists()
    assert _processes_naming(str(tmp)) == []


@pytest.mark.timeout(120)
def test_sigterm_ends_the_demo_as_ctrl_c_does_its_job_processes_and_temporary_directory_gone():
    """SIGTERM (a scheduler ending the demo, `timeout make demo`) left the job processes
    running and /tmp/tunecache-demo-* behind: Python's default action ends at once."""
    proc, stdout, stderr, tmp = _stop_the_demo_once_its_first_job_process_started(signal.SIGTERM)
    assert proc.returncode == 143, (stdout, stderr)
    assert stdout.splitlines()[-1] == f"interrupted: the demo stopped (SIGTERM); removed {tmp}"
    assert stderr == ""
    assert not tmp.exists()
    assert _processes_naming(str(tmp)) == []


def _side(benchmarks: float, seconds: float) -> dict[str, float]:
    return {"benchmarks": benchmarks, "benchmark_seconds": seconds}


def test_the_result_line_states_benchmarks_and_their_seconds_per_job_off_against_on():
    line = demo.result_line(_side(4, 41.23), _side(2, 9.8), _side(0, 0.0))
    assert line == ("result: per job, tunecache off ran 4 GEMM benchmarks (41.2s); on, the "
                    "first job ran 2 (9.8s) and a later job 0 (0.0s): 41.2s of benchmarking "
                    "saved in every later job")


def test_the_result_line_gives_a_mean_over_rounds_and_says_so_when_tunecache_cost_more():
    line = demo.result_line(_side(4, 1.0), _side(2.5, 0.9), _side(1 / 3, 1.5))
    assert line == ("result: per job, tunecache off ran 4 GEMM benchmarks (1.0s); on, the "
                    "first job ran 2.5 (0.9s) and a later job 0.3 (1.5s): 0.5s of benchmarking "
                    "added in every later job")


def test_the_side_that_runs_first_alternates_and_round_one_starts_with_tunecache():
    """Every round started with tunecache off, so its job paid the page cache's misses (73 s
    against 30 s the next round) and flattered tunecache."""
    off, first, later = ("off", "job0", False), ("first", "job1", True), ("later", "job2", True)
    orders = [demo.round_order(r, off, [first, later]) for r in (1, 2, 3, 4)]
    assert orders == [[first, later, off], [off, first, later]] * 2


def test_the_kept_database_and_the_commands_printed_for_it_work_as_printed(tmp_path):
    """The demo removed its databases and printed nothing to try; `tunecache` is not on PATH
    in an environment nobody activated, so the commands name its script."""
    db = tmp_path / "round1.db"
    assert run("upgrade", "--db", str(db)).exit_code == 0
    kept = demo.keep_database(db)
    try:
        db.unlink()
        commands = demo.explore_commands(str(kept), "0123456789abcdef")
        assert [shlex.split(c)[1:] for c in commands] == [
            ["stats", "--db", str(kept)], ["ls", "--db", str(kept)],
            ["show", "--db", str(kept), "0123456789ab"]]
        for command in commands[:2]:
            done = subprocess.run(shlex.split(command), capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
    finally:
        kept.unlink()
