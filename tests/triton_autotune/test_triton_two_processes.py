"""tunecache.inductor's Triton section.

Real processes: two ranks share configs, a killed or stopped rank is taken over.

Triton is not installed on the CPU test machines: autotune_helpers.py says how these tests
drive Inductor's own autotune-cache code with fake configs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from autotune_helpers import (  # noqa: E402
    RANK_WORKER,
    coordesc_proc,
    rank_env,
    rank_result,
    run_rank,
    stored,
    wait_for,
)
from torch._inductor import config as inductor_config  # noqa: E402

import tunecache  # noqa: E402


def test_two_processes_share_one_best_config(tmp_path):
    db = str(tmp_path / "tune.db")
    first = run_rank(db, tmp_path, 0, "tune")
    assert first["state"] == "miss" and first["stats"]["published"] == 1
    second = run_rank(db, tmp_path, 1, "read")
    assert second["state"] == "hit"
    assert second["best"] == first["best"] == [{"XBLOCK": 512}, 8, 1]
    assert second["stats"]["hits"] == 1 and second["stats"]["puts"] == 0


def test_triton_sharing_is_off_when_opted_out(tmp_path):
    threads, remote = inductor_config.compile_threads, inductor_config.autotune_remote_cache
    cache = tunecache.open(str(tmp_path / "tune.db"), share="-triton")
    assert tunecache.enable(cache)
    try:
        assert inductor_config.compile_threads == threads
        assert inductor_config.autotune_remote_cache == remote
    finally:
        tunecache.disable()


def test_triton_sharing_is_on_by_default(tmp_path):
    remote = inductor_config.autotune_remote_cache
    cache = tunecache.open(str(tmp_path / "tune.db"))
    assert cache.settings.shares("triton")
    assert tunecache.enable(cache)
    try:
        assert inductor_config.autotune_remote_cache is True
    finally:
        tunecache.disable()
    assert inductor_config.autotune_remote_cache == remote


def test_a_rank_killed_while_tuning_is_taken_over_by_its_peer(tmp_path):
    holder = coordesc_proc(tmp_path, 0, kernels=1, tune_seconds=60, barrier=False)
    wait_for(tmp_path / "tuning-0")  # it holds the claim, and tunes
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    peer = rank_result(coordesc_proc(tmp_path, 1, kernels=1, tune_seconds=0.1, barrier=False))
    assert peer["tuned"] == [0]  # took the key over once the lease passed
    assert peer["final"] == [[{"XBLOCK": 128}, 4, True]]
    cache = tunecache.open(str(tmp_path / "tune.db"))
    try:
        (row,) = stored(cache)
    finally:
        cache.close()
    assert row["state"] == "done"
    assert json.loads(next(iter(json.loads(row["timings_json"]))))["XBLOCK"] == 128


def test_a_rank_stopped_past_its_lease_adopts_the_peers_result_when_it_resumes(tmp_path):
    holder = coordesc_proc(tmp_path, 0, kernels=1, tune_seconds=4, barrier=False)
    wait_for(tmp_path / "tuning-0")
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        peer = rank_result(coordesc_proc(tmp_path, 1, kernels=1, tune_seconds=0.1,
                                      barrier=False))
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    stopped = rank_result(holder)
    assert peer["tuned"] == [0] and stopped["tuned"] == [0]  # both measured: it was late
    # Its late publish was refused, and it runs the stored config like its peer.
    assert stopped["final"] == peer["final"] == [[{"XBLOCK": 128}, 4, True]]


def test_two_processes_split_coordinate_descent_and_end_on_the_same_configs(tmp_path):
    # Two ranks run the same 8 kernels in the same order, step after step. Each rank's
    # fake coordinate descent finds a different config, so a kernel tuned by both, or
    # not adopted, would show. No claim may expire here: on a loaded machine a 2 s lease
    # can pass between a rank's claim and its publish, and its peer would tune it too.
    ranks = [coordesc_proc(tmp_path, i, kernels=8, tune_seconds=0.3, barrier=True,
                            lease=60.0) for i in (0, 1)]
    a, b = (rank_result(r) for r in ranks)
    assert sorted(a["tuned"] + b["tuned"]) == list(range(8))  # each kernel tuned once
    assert a["tuned"] and b["tuned"]  # and the work was split
    # A kernel's configs were benchmarked by the rank that tuned it, and only there, the
    # first kernel too, which both ranks reached at the same moment.
    assert a["benchmarked"] == a["tuned"] and b["benchmarked"] == b["tuned"]
    assert a["final"] == b["final"]
    assert all(found for _, _, found in a["final"])
    assert a["deferred"] + b["deferred"] >= 1
    # Neither rank waited for the other: a deferred kernel ran untuned meanwhile.
    assert a["peer_wait_seconds"] == b["peer_wait_seconds"] == 0.0


def test_two_processes_split_the_split_size_search_and_pick_the_same_value(tmp_path):
    # Each candidate value takes 0.5 s to measure (5 coordinate-descent benchmarks); the
    # search visits 8, 16, 32 (its first round), then one value a round: 64, 128 (the
    # best), 256.
    procs = []
    for index in (0, 1):
        env = rank_env()
        procs.append(subprocess.Popen(
            [sys.executable, str(RANK_WORKER), "split-size", str(tmp_path / "tune.db"),
             str(tmp_path), str(index)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    a, b = (rank_result(p) for p in procs)
    assert a["best"] == b["best"] == 128
    measured = sorted(a["measured"] + b["measured"])
    assert len(set(measured)) == len(measured)  # each value once in the job
    # ... every value the search asked for, and maybe the one past its end, measured
    # ahead by a rank while the other measured 256.
    assert set(measured) - {512} == {8, 16, 32, 64, 128, 256}
    assert a["measured"] and b["measured"]  # split between them
    assert a["left_to_peer"] + b["left_to_peer"] >= 1
    # The later rounds: one rank measured ahead while the other measured the value asked.
    assert a["ahead"] + b["ahead"] >= 1
    # 512, if started, was measured ahead of 256, which did not beat 128: it ran to the
    # end only if no benchmark of it came after 256's timing.
    assert a["stopped"] + b["stopped"] <= (512 in measured)
