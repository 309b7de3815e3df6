"""tools/bench_compile_threads.py: Triton's compile of one kernel's configs, serially and
over threads, for a CUDA target on this CPU (real compiles, each pass in a cache
directory of its own)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench_compile_threads.py"


def _tool_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_compile_threads", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_parallel_fraction_is_amdahls_law_solved_for_it() -> None:
    fraction = _tool_module().parallel_fraction
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
