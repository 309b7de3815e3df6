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


def _set_columns(url: str, key_hash: str, **values) -> None:
    from sqlalchemy import create_engine, update

    from tunecache.settings import resolve_db_url
    from tunecache.store.schema import entries

    engine = create_engine(resolve_db_url(url))
    with engine.begin() as conn:
        conn.execute(update(entries).where(entries.c.key_hash == key_hash).values(**values))
    engine.dispose()


def test_export_header_counts_only_the_entries_written(db_url):
    _good, bad, _ = populate(db_url, [gemm_key("mm", i) for i in range(3)])
    _set_columns(db_url, bad.key_hash, timings_json='{"aten": -1}')
    result = run("export", "--db", db_url)
    assert result.exit_code == 0
    header, *lines = (json.loads(line) for line in result.stdout.splitlines())
    assert len(lines) == 2
    assert (header["entries"], header["graphs"]) == (2, 0)
    assert result.stderr.splitlines()[0] == "exported 2 entries; skipped 1 invalid"


def test_import_and_merge_keep_the_source_entries_times(db_url, tmp_path):
    (result,) = populate(db_url, [gemm_key("mm", 0)])
    long_ago = time.time() - 90 * 86400
    _set_columns(db_url, result.key_hash, created_at=long_ago, updated_at=long_ago + 60,
                 last_used_at=long_ago + 120)
    export = tmp_path / "x.jsonl"
    assert run("export", "--db", db_url, "-o", str(export)).exit_code == 0
    imported, merged = str(tmp_path / "imported.db"), str(tmp_path / "merged.db")
    assert run("import", str(export), "--db", imported).exit_code == 0
    assert run("merge", db_url, "--into", merged).exit_code == 0
    for target in (imported, merged):
        shown = run_json("show", "--db", target, result.key_hash)
        assert (shown["created_at"], shown["updated_at"], shown["last_used_at"]) == pytest.approx(
            (long_ago, long_ago + 60, long_ago + 120), abs=1e-3), target


def test_import_clamps_entry_times_from_the_future_to_now(tmp_path):
    future = time.time() + 365 * 86400
    header = json.dumps({"format": "tunecache-export", "version": 1})
    line = json.dumps({"key": gemm_key("mm", 0), "timings": {"aten": 1.0},
                       "created_at": future, "updated_at": future, "last_used_at": future})
    path = tmp_path / "x.jsonl"
    path.write_text(f"{header}\n{line}\n")
    target = str(tmp_path / "t.db")
    before = time.time()
    assert run("import", str(path), "--db", target).exit_code == 0
    shown = run_json("show", "--db", target, run_json("ls", "--db", target)[0]["key_hash"])
    assert before - 1 <= shown["created_at"] <= time.time() + 1
    assert before - 1 <= shown["last_used_at"] <= time.time() + 1


def test_graph_loads_are_counted_and_their_last_use_is_recorded_to_the_second(db_url,
                                                                              tmp_path):
    """Graph reuse is visible: every load counts (batched like GEMM hits, written when the
    job's counters are), and the last use shown is the load's time, not the hour's."""
    from tunecache.core.graphs import GraphShare
    from tunecache.core.signing import PRIVATE_KEY_NAME, write_key_pair
    from tunecache.settings import Settings

    write_key_pair(tmp_path / "keys")
    plan = Settings.from_env({}, signing_key=str(tmp_path / "keys" / PRIVATE_KEY_NAME)
                             ).graph_sharing()
    with tunecache.open(db_url) as publisher:
        share = GraphShare.from_settings(plan, lambda: publisher)
        assert share.publish("fxgraph", "k1", b"graph bytes", "2.13.0")
    # Published half an hour ago: an hourly "touch" would leave its last use there.
    from sqlalchemy import create_engine, update

    from tunecache.settings import resolve_db_url
    from tunecache.store.schema import artifacts

    engine = create_engine(resolve_db_url(db_url))
    with engine.begin() as conn:
        conn.execute(update(artifacts).values(created_at=time.time() - 1800,
                                              last_used_at=time.time() - 1800))
    engine.dispose()
    for _ in range(2):
        with tunecache.open(db_url) as job:
            share = GraphShare.from_settings(plan, lambda: job)
            before = time.time()
            assert share.load("fxgraph", "k1") == b"graph bytes"
            assert share.load("fxgraph", "k1") == b"graph bytes"
    stats = run_json("stats", "--db", db_url)["graphs"]
    assert stats["hits"] == 4
    assert [g["hits"] for g in stats["groups"]] == [4]
    (row,) = run_json("ls", "--graphs", "--db", db_url)
    assert row["hits"] == 4
    assert row["last_used_at"] >= before - 1
    human = run("stats", "--db", db_url).stdout
    assert "graphs    1 compiled graph, 19 B (fxgraph 1), 4 loads" in human
