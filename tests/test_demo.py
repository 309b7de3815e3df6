"""tools/demo.py (`make demo`): Ctrl-C ends it in one line, exit 130, its temporary
directory and job processes gone."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import procs
import pytest

DEMO = Path(__file__).resolve().parent.parent / "tools" / "demo.py"


def _ctrl_c_as_in_a_terminal() -> None:
    """SIGINT's default action in the demo, as a terminal's shell starts it: a test run in
    the background (``nohup make test &``) passes SIGINT on ignored, and a Python started
    with SIGINT ignored never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(120)
def test_ctrl_c_ends_the_demo_in_one_line_with_exit_130_and_removes_its_temporary_directory():
    """The demo is signalled once its first job process has started (still importing
    torch, long before any compile): nothing of the demo's is left behind."""
    proc = subprocess.Popen([sys.executable, str(DEMO), "--procs", "1", "--rounds", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        first = proc.stdout.readline()
        tmp = Path(re.search(r" in (\S+) \(removed at the end\)", first).group(1))
        procs.wait_until(lambda: (tmp / "job0-round1-0.log").exists() or proc.poll() is not None,
                         "the first job process started")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (stdout, stderr)
    assert stdout.splitlines()[-1] == f"interrupted: the demo stopped (Ctrl-C); removed {tmp}"
    assert stderr == ""
    assert not tmp.exists()
