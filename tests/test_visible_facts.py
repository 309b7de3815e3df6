"""What a newcomer reads must be true and visible: one line per bad setting, naming the
variable set and the fix; warm's skip reasons in words; export headers, import times and
compiled-graph use that match what happened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import gemm_key, populate, run, run_json
import tunecache

REPO = Path(__file__).resolve().parents[1]


def test_lock_timeout_above_half_the_lease_names_that_variable_its_bound_and_the_fix(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TUNECACHE_LOCK_TIMEOUT", "100")
    result = run("stats", "--db", str(tmp_path / "x.db"))
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: TUNECACHE_LOCK_TIMEOUT='100' is invalid: expected at most 15, half of "
        "TUNECACHE_LEASE_SECONDS=30 (a live owner's claim must outlast a heartbeat's wait for "
        "a lock); lower TUNECACHE_LOCK_TIMEOUT, or raise TUNECACHE_LEASE_SECONDS to at least "
        "200\n")


def test_bad_setting_in_a_job_is_reported_once(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    env.update(TUNECACHE_DB=str(tmp_path / "tune.db"), TUNECACHE_MODE="bogus",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, "-c", "import torch, torch._inductor.select_algorithm, "
                               "torch._inductor.runtime.autotune_cache"],
        env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "TUNECACHE_MODE" in line]
    assert len(lines) == 1, done.stderr


def test_merge_refuses_into_together_with_db(tmp_path):
    src, a, b = (str(tmp_path / n) for n in ("src.db", "a.db", "b.db"))
    populate(src, [gemm_key("mm", 0)])
    result = run("merge", src, "--into", a, "--db", b)
    assert result.exit_code == 2
    assert result.stderr == "Error: --into and --db both name the target: give one of them\n"
    assert not os.path.exists(a) and not os.path.exists(b)


def test_warm_says_in_words_which_field_a_recorded_key_lacks(sqlite_url):
    key = {"kind": "gemm", "op": "mm", "env": {"device": "cpu-x", "torch": "2.12.0"}}
    populate(sqlite_url, [key])
    data = run_json("warm", "--db", sqlite_url, "--dry-run")
    assert [s["reason"] for s in data["skipped"]] == [
        'the recorded key has no "inputs" (the shapes warm needs to rebuild the call)']
