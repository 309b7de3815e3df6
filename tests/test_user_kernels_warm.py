"""`tunecache warm --user-kernels PACKAGE`: the keys of users' ``@triton.autotune``
kernels recorded under one Triton are tuned again under another by calling each kernel as
the job that tuned it did, so the next job there benchmarks nothing. Real processes
(tests/user_kernel_library.py under Triton's interpreter), real SQLite and PostgreSQL.
A changed Triton setting that Triton keys its compiles on (``TRITON_DEFAULT_FP_FUSION``)
stands for the new Triton: it changes the key the way an upgrade does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

import tunecache

pytest.importorskip("triton")

TESTS = Path(__file__).resolve().parent
CONFIGS = 3  # the library's kernel has three configs
NEW_TRITON = {"TRITON_DEFAULT_FP_FUSION": "0"}


def _env(db: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNECACHE_", "TRITON_"))}
    env.update(TUNECACHE_DB=db, TRITON_INTERPRET="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), str(TESTS.parent),
                                                      env.get("PYTHONPATH")]))
    return env


def _job(db: str, tmp: Path, sizes: str, **extra: str) -> dict:
    out = tmp / "job.json"
    code = "import sys, user_kernel_library as lib; lib.job(sys.argv[1], sys.argv[2])"
    done = subprocess.run([sys.executable, "-c", code, str(out), sizes],
                          env=_env(db, **extra), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def _warm(db: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunecache.cli", "warm", "--json", *args],
                          env=_env(db, **extra), capture_output=True, text=True, timeout=240)


def _warm_json(db: str, *args: str, **extra: str) -> dict:
    done = _warm(db, *args, **extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_warm_tunes_recorded_user_kernel_keys_under_a_new_triton_and_the_next_job_benchmarks_none(
        db_url, tmp_path):
    recorded = _job(db_url, tmp_path, "1000,3000")
    assert recorded["benchmarks"] == 2 * CONFIGS and recorded["stats"]["tuned"] == 2

    warmed = _warm_json(db_url, "--user-kernels", "user_kernel_library", **NEW_TRITON)
    assert warmed["user_kernels"] == 2
    assert [t["outcome"] for t in warmed["tasks"]] == ["tuned", "tuned"], warmed
    assert (warmed["rank"], warmed["world_size"]) == (0, 1)
    assert warmed["error"] == 0 and warmed["skipped"] == []

    job = _job(db_url, tmp_path, "1000,3000", **NEW_TRITON)
    assert job["benchmarks"] == 0, "warm tuned both keys for this Triton"
    assert job["stats"]["hits"] == 2 and all(job["correct"].values())

    again = _warm_json(db_url, "--user-kernels", "user_kernel_library", **NEW_TRITON)
    assert [t["outcome"] for t in again["tasks"]] == ["hits", "hits"], "nothing tuned twice"


def test_warm_dry_run_lists_the_recorded_keys_of_the_packages_named_only(sqlite_url, tmp_path):
    _job(sqlite_url, tmp_path, "1000")
    listed = _warm_json(sqlite_url, "--user-kernels", "user_kernel_library", "--dry-run")
    assert listed["dry_run"] is True and listed["user_kernels"] == 1
    assert listed["tasks"][0]["kernel"] == "user_kernel_library.accumulate"
    assert listed["tasks"][0]["tuning_key"] == [1000, "torch.float32", "torch.float32"]
    other = _warm_json(sqlite_url, "--user-kernels", "liger_kernel", "--dry-run")
    assert other["user_kernels"] == 0 and other["tasks"] == []


def _plant_call(db: str, call: object) -> None:
    """Replace every recorded call with ``call`` (an adversary who can write the store)."""
    with tunecache.open(db) as cache:
        cache.store.db.run(lambda c: c.execute(
            text("UPDATE tunecache_entries SET meta_json = :m WHERE kind = 'user_kernel'"),
            {"m": json.dumps({"replay": call})}))


@pytest.mark.parametrize("call, reason", [
    ({"args": [{"tensor": {"shape": [2**30, 2**30], "stride": [2**30, 1],
                           "dtype": "float32"}}], "kwargs": {}, "grids": {}}, "bytes, over"),
    ({"args": [{"tensor": {"shape": [4], "stride": [1], "dtype": "object"}}],
      "kwargs": {}, "grids": {}}, "dtype"),
    ({"args": [{"value": {"__class__": "os.system"}}], "kwargs": {}, "grids": {}}, "value"),
    ({"args": [], "kwargs": {}, "grids": {"not a config": [1, 1, 1]}}, "config the kernel"),
])
def test_a_planted_call_is_refused_before_anything_is_allocated(sqlite_url, tmp_path, call,
                                                                 reason):
    _job(sqlite_url, tmp_path, "1000")
    _plant_call(sqlite_url, call)
    done = _warm(sqlite_url, "--user-kernels", "user_kernel_library", **NEW_TRITON)
    assert done.returncode == 1, "a refused call is a failed key"
    report = json.loads(done.stdout)
    assert report["error"] == 1 and reason in report["tasks"][0]["error"], report
    assert len(done.stderr.splitlines()) <= 3, done.stderr


def test_keys_whose_call_was_not_recorded_are_reported_as_skipped_not_left_out(sqlite_url,
                                                                              tmp_path):
    # A call with an argument warm cannot rebuild (Liger's SwiGLU kernels take tensor
    # descriptors) is stored without its call: the entry a job leaves then.
    _job(sqlite_url, tmp_path, "1000,3000")

    def drop_call_at_1000(conn):  # type: ignore[no-untyped-def]
        for key_hash, key_json in conn.execute(text(
                "SELECT key_hash, key_json FROM tunecache_entries WHERE kind = 'user_kernel'")):
            if json.loads(key_json)["tuning_key"][0] == 1000:
                conn.execute(text("UPDATE tunecache_entries SET meta_json = '{}' "
                                  "WHERE key_hash = :h"), {"h": key_hash})

    with tunecache.open(sqlite_url) as cache:
        cache.store.db.run(drop_call_at_1000)
    done = _warm(sqlite_url, "--user-kernels", "user_kernel_library", **NEW_TRITON)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [t["tuning_key"][0] for t in report["tasks"]] == [3000], report
    assert [(s["kernel"], s["tuning_key"][0]) for s in report["skipped"]] == [
        ("user_kernel_library.accumulate", 1000)], report
    assert "not recorded" in report["skipped"][0]["reason"]
    other = _warm_json(sqlite_url, "--user-kernels", "liger_kernel", "--dry-run")
    assert other["skipped"] == [], "another package's keys are not this warm's to report"

    human = subprocess.run(
        [sys.executable, "-m", "tunecache.cli", "warm", "--user-kernels",
         "user_kernel_library", "--dry-run"],
        env=_env(sqlite_url, **NEW_TRITON), capture_output=True, text=True, timeout=240)
    assert human.returncode == 0, human.stderr
    assert "skipped user_kernel_library.accumulate [1000" in human.stderr


def test_warm_user_kernels_refuses_other_modes_with_a_one_line_error(sqlite_url):
    done = _warm(sqlite_url, "--user-kernels", "user_kernel_library", "--exhaustive")
    assert done.returncode == 2 and "--user-kernels" in done.stderr
    done = _warm(sqlite_url, "--user-kernels", "not a package")
    assert done.returncode == 2 and "import name" in done.stderr


def test_warm_user_kernels_of_a_package_not_installed_is_a_one_line_error(sqlite_url):
    # A nightly job with a typo in the package's name warms nothing: it must fail.
    done = _warm(sqlite_url, "--user-kernels", "user_kernel_library", "--user-kernels",
                 "no_such_pkg")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        "--user-kernels: no installed package named no_such_pkg")
