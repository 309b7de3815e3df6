"""tunecache warm: re-tune recorded GEMM keys on this machine (real Inductor autotune on CPU).

torch 2.13's CPU build really autotunes bmm (ATen vs the C++ bmm template, about 3-6 s a
key), so these tests run the whole path: keys recorded under an older torch, `tunecache
warm` in a fresh process, then a fresh compiling process that must benchmark nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import populate, run, run_json

pytest.importorskip("torch")

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TUNECACHE = Path(sys.executable).with_name("tunecache")

# Inductor's inputs_key for bmm of (4,32,48) x (4,48,40) fp32 contiguous: what
# tests/inductor_worker.py --ops bmm compiles.
WORKER_BMM = ("[('cpu', 'torch.float32', 4, 32, 48, 1536, 48, 1, 0), "
              "('cpu', 'torch.float32', 4, 48, 40, 1920, 40, 1, 0)]")
SMALL_BMM = ("[('cpu', 'torch.float32', 2, 16, 24, 384, 24, 1, 0), "
             "('cpu', 'torch.float32', 2, 24, 8, 192, 8, 1, 0)]")


def old_key(inputs: str, op: str = "bmm", torch: str = "2.12.0+cpu") -> dict:
    """A key as an earlier job under another torch build recorded it."""
    return {"kind": "gemm", "op": op, "inputs": inputs, "precision": "highest",
            "hint_override": None,
            "env": {"device": "Old CPU", "device_type": "cpu", "torch": torch,
                    "triton": "none", "threads": str(_threads())}}


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _env(tmp: Path, db: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    cache_dir = tmp / f"inductor-{time.monotonic_ns()}"
    cache_dir.mkdir(parents=True)
    env.update(TUNECACHE_DB=db, TORCHINDUCTOR_CACHE_DIR=str(cache_dir),
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0", **extra)
    return env


def _warm(tmp: Path, db: str, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([str(TUNECACHE), "warm", "--json", *args], env=_env(tmp, db, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(tmp))


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def test_warm_dry_run_selects_and_dedups(sqlite_url):
    populate(sqlite_url, [old_key(WORKER_BMM), old_key(WORKER_BMM, torch="2.11.0"),
                          old_key(SMALL_BMM), old_key("[]", op="mm"),
                          {"kind": "other", "op": "bmm", "inputs": WORKER_BMM}])
    data = run_json("warm", "--db", sqlite_url, "--dry-run", "--op", "bmm")
    assert data["keys"] == 2
    assert [len(t["seen_in"]) for t in data["tasks"]] == [1, 2]
    only = run_json("warm", "--db", sqlite_url, "--dry-run", "--from-torch", "2.11.0")
    assert [t["inputs"] for t in only["tasks"]] == [WORKER_BMM]
    bad = run("warm", "--db", sqlite_url, "--op", "conv")
    assert bad.exit_code == 2


def test_warm_then_a_fresh_job_benchmarks_nothing(sqlite_url, tmp_path):
    populate(sqlite_url, [old_key(WORKER_BMM)])
    report = _finish(_warm(tmp_path, sqlite_url))
    assert (report["keys"], report["tuned"], report["error"]) == (1, 1, 0), report
    assert report["tasks"][0]["benchmarks"] == 1

    out = tmp_path / "job.json"
    job = subprocess.run(
        [sys.executable, str(TESTS / "inductor_worker.py"), "--ops", "bmm", "--out", str(out)],
        env=_env(tmp_path, sqlite_url, PYTHONPATH=str(REPO)), capture_output=True, text=True,
        timeout=300, check=False)
    assert job.returncode == 0, job.stderr[-3000:]
    stats = json.loads(out.read_text())["stats"]
    assert stats["benchmarks"] == 0 and stats["hits"] == 1, stats

    again = _finish(_warm(tmp_path, sqlite_url))  # nothing left to do: no compile at all
    assert (again["hit"], again["tuned"]) == (1, 0)


def test_warm_splits_work_across_ranks(pg_url, tmp_path):
    # PostgreSQL, as a cluster runs it; the claims themselves are tested on both backends
    # in the core tests, and each run here costs two compiling processes.
    db_url = pg_url
    populate(db_url, [old_key(WORKER_BMM), old_key(SMALL_BMM)])
    procs = [_warm(tmp_path, db_url, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r))
             for r in range(2)]
    reports = [_finish(p) for p in procs]
    assert [r["tuned"] for r in reports] == [1, 1], reports
    assert all(r["hit"] + r["peer"] == 1 for r in reports)
    tuned = [t["key_hashes"] for r in reports for t in r["tasks"] if t["outcome"] == "tuned"]
    assert len({h for hs in tuned for h in hs}) == 2  # each key tuned once, by one rank


@pytest.mark.parametrize("hostile", ["(" * 1500 + ")" * 1500, "__import__('os').system('true')",
                                     "[('cuda', 'torch.float32', 8, 8, 8, 1)] " * 200])
def test_hostile_inputs_key_is_refused_with_a_value_error(hostile):
    from tunecache.warm import parse_inputs

    with pytest.raises(ValueError):
        parse_inputs(hostile)
