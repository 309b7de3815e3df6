"""tools/bench_compile_threads.py: Triton's compile of one kernel's configs, serially and
over threads, for a CUDA target on this CPU (real compiles, each pass in a cache
directory of its own)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tool_modules import TOOLS, load_tool

TOOL = TOOLS / "bench_compile_threads.py"


def test_the_parallel_fraction_is_amdahls_law_solved_for_it() -> None:
    fraction = load_tool("bench_compile_threads").parallel_fraction
    assert fraction(2.0, 2) == pytest.approx(1.0)
    assert fraction(1.0, 4) == pytest.approx(0.0)
    assert fraction(1.6, 2) == pytest.approx(0.75)
    assert fraction(1.5, 1) is None


def test_each_pass_compiles_every_config_itself_and_reports_it() -> None:
    done = subprocess.run([sys.executable, str(TOOL), "--json", "--configs", "3",
                           "--threads", "2"],
                          check=True, capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    assert report["configs"] == 3
    # One cache entry per compile, in each pass's own directory: no pass hit another's.
    assert report["serial_compiled"] == 3
    [threaded] = report["threaded"]
    assert threaded["threads"] == 2 and threaded["compiled"] == 3
