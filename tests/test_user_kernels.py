"""Users' own ``@triton.autotune`` kernels tuned once per cluster (tunecache.user_kernels):
real processes (tests/user_kernel_worker.py) that set nothing but ``TUNECACHE_DB``, run a
real Triton autotuner under Triton's interpreter on CPU, over real SQLite files and
PostgreSQL."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import run, run_json
from sqlalchemy import text

import tunecache

triton = pytest.importorskip("triton")

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "user_kernel_worker.py"
CONFIGS = 3  # the worker's kernel has three configs


def _env(db: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TRITON_"))}
    env.update(TUNECACHE_DB=db, TRITON_INTERPRET="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS.parent),
                                                      env.get("PYTHONPATH")]))
    return env


def _start(db: str, out: Path, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKER), str(out), *args], env=_env(db, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str], out: Path) -> tuple[dict, str]:
    _, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr
    return json.loads(out.read_text()), stderr


def _job(db: str, tmp: Path, name: str, *args: str, **extra: str) -> tuple[dict, str]:
    out = tmp / f"{name}.json"
    return _finish(_start(db, out, *args, **extra), out)


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tunecache")]


def _sqlite_file(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def _user_kernel_rows(db: str) -> list:
    with tunecache.open(db) as cache:
        return cache.store.db.run(lambda c: c.execute(text(
            "SELECT key_hash, timings_json FROM tunecache_entries "
            "WHERE kind = 'user_kernel' ORDER BY key_hash")).fetchall())


def test_a_new_node_launches_the_stored_winners_with_no_benchmark(db_url, tmp_path):
    first, stderr = _job(db_url, tmp_path, "first", "--sizes", "1000,3000")
    assert first["benchmarks"] == 2 * CONFIGS
    assert first["stats"]["tuned"] == 2 and _warnings(stderr) == []
    # restore_value put back what every benchmark added: each output is x + 1 once
    assert all(first["correct"].values())

    second, stderr = _job(db_url, tmp_path, "second", "--sizes", "1000,3000")
    assert second["benchmarks"] == 0
    assert second["stats"]["hits"] == 2 and _warnings(stderr) == []
    assert second["winners"] == first["winners"]
    assert all(second["correct"].values())
    assert len(_user_kernel_rows(db_url)) == 2


def test_processes_started_together_tune_each_key_once_between_them(db_url, tmp_path):
    tunecache.open(db_url).close()  # the schema, before the workers race to make it
    sizes = ["1000", "3000", "5000"]
    parties = 3
    procs = []
    for i in range(parties):
        order = ",".join(sizes[i:] + sizes[:i])  # each starts on another key
        out = tmp_path / f"rank{i}.json"
        procs.append((_start(db_url, out, "--sizes", order, "--barrier", str(tmp_path),
                             "--parties", str(parties), "--index", str(i)), out))
    reports = [_finish(proc, out)[0] for proc, out in procs]
    assert sum(r["benchmarks"] for r in reports) == len(sizes) * CONFIGS
    assert sum(r["stats"]["tuned"] for r in reports) == len(sizes)
    assert sum(r["stats"]["hits"] + r["stats"]["peer"] for r in reports) == \
        (parties - 1) * len(sizes)
    # every rank launches the same config for every key
    assert all(r["winners"] == reports[0]["winners"] for r in reports)
    assert all(all(r["correct"].values()) for r in reports)


def test_a_key_whose_tuner_is_killed_is_tuned_by_the_peer_waiting_for_it(db_url, tmp_path):
    tunecache.open(db_url).close()
    frozen = tmp_path / "frozen"
    lease = {"TUNECACHE_LEASE_SECONDS": "3"}
    owner = _start(db_url, tmp_path / "owner.json", "--sizes", "1000", "--freeze", str(frozen),
                   **lease)
    try:
        deadline = time.monotonic() + 120
        while not frozen.exists():  # the owner holds the claim and is benchmarking
            assert owner.poll() is None and time.monotonic() < deadline, owner.communicate()
            time.sleep(0.05)
        peer = _start(db_url, tmp_path / "peer.json", "--sizes", "1000", **lease)
        time.sleep(1)  # the peer finds the claim taken and waits on it
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.communicate()
    report, _ = _finish(peer, tmp_path / "peer.json")
    assert report["stats"]["tuned"] == 1 and report["benchmarks"] == CONFIGS
    assert all(report["correct"].values())
    [(_, stored)] = _user_kernel_rows(db_url)
    assert len(json.loads(stored)) == CONFIGS


def test_an_edited_kernel_is_tuned_again(sqlite_url, tmp_path):
    _job(sqlite_url, tmp_path, "original", "--sizes", "1000")
    changed, _ = _job(sqlite_url, tmp_path, "changed", "--sizes", "1000", "--variant", "changed")
    assert changed["benchmarks"] == CONFIGS and changed["stats"]["tuned"] == 1
    assert len(_user_kernel_rows(sqlite_url)) == 2


def test_pruned_configs_stay_pruned_and_are_part_of_the_key(sqlite_url, tmp_path):
    pruned, _ = _job(sqlite_url, tmp_path, "pruned", "--sizes", "1000", "--prune", "128")
    assert pruned["benchmarks"] == 2 and pruned["winners"]["1000"] in (64, 128)
    again, _ = _job(sqlite_url, tmp_path, "again", "--sizes", "1000", "--prune", "128")
    assert again["benchmarks"] == 0 and again["winners"] == pruned["winners"]
    # all three configs make another key: its winner may be the one the pruning left out
    whole, _ = _job(sqlite_url, tmp_path, "whole", "--sizes", "1000")
    assert whole["benchmarks"] == CONFIGS and whole["stats"]["tuned"] == 1


def _set_timings(db: str, key_hash: str, timings: dict[str, float]) -> None:
    """Rewrite a stored entry's timings, as someone with write access to the database may."""
    with tunecache.open(db) as cache:
        cache.store.db.run(lambda c: c.execute(
            text("UPDATE tunecache_entries SET timings_json = :t WHERE key_hash = :h"),
            {"t": json.dumps(timings), "h": key_hash}), write=True)


def _plant(db: str, timings: dict[str, float]) -> None:
    [(key_hash, _)] = _user_kernel_rows(db)
    _set_timings(db, key_hash, timings)


@pytest.mark.parametrize("planted", [
    '{"BLOCK":128,"num_ctas":1,"num_stages":3,"num_warps":64}',  # bad warps
    '{"BLOCK":1048576,"num_ctas":1,"num_stages":3,"num_warps":2}',  # a huge block
    '{"EVIL":1,"num_ctas":1,"num_stages":3,"num_warps":2}',  # a name the kernel lacks
], ids=["warps", "block", "name"])
def test_a_stored_config_that_is_not_the_kernels_own_is_refused(sqlite_url, tmp_path, planted):
    _job(sqlite_url, tmp_path, "first", "--sizes", "1000")
    [(_, stored)] = _user_kernel_rows(sqlite_url)
    _plant(sqlite_url, {**json.loads(stored), planted: 1e-6})

    second, stderr = _job(sqlite_url, tmp_path, "second", "--sizes", "1000,1000")
    assert second["stats"]["refused"] == 1 and second["stats"]["hits"] == 0
    assert second["benchmarks"] == CONFIGS  # Triton tuned it, once: then its own cache
    assert second["winners"]["1000"] in (64, 128, 256)
    assert all(second["correct"].values())
    [warning] = _warnings(stderr)
    assert "stored tuning refused" in warning and "not among the kernel's own" in warning


def test_a_refused_entry_is_replaced_by_the_job_that_measures_and_the_next_hits(db_url,
                                                                              tmp_path):
    """Left in place, a refused entry was refused (with a warning) by every job."""
    _job(db_url, tmp_path, "first", "--sizes", "1000")
    _plant(db_url, {'{"EVIL":1,"num_ctas":1,"num_stages":3,"num_warps":2}': 1e-6})
    second, stderr = _job(db_url, tmp_path, "second", "--sizes", "1000")
    assert second["stats"]["refused"] == 1 and second["benchmarks"] == CONFIGS
    assert len(_warnings(stderr)) == 1
    [(_, replaced)] = _user_kernel_rows(db_url)
    assert "EVIL" not in replaced and len(json.loads(replaced)) == CONFIGS
    third, stderr = _job(db_url, tmp_path, "third", "--sizes", "1000")
    assert third["stats"]["hits"] == 1 and third["benchmarks"] == 0
    assert _warnings(stderr) == []


def test_a_stored_config_that_fails_to_launch_falls_back_to_tritons_tuning(sqlite_url, tmp_path):
    _job(sqlite_url, tmp_path, "first", "--sizes", "1000")
    [(_, stored)] = _user_kernel_rows(sqlite_url)
    # The largest block wins, and this node cannot launch it (as a GPU with less shared
    # memory than the publisher's would not).
    _plant(sqlite_url, {name: (0.001 if '"BLOCK":256' in name else 1.0)
                        for name in json.loads(stored)})

    second, stderr = _job(sqlite_url, tmp_path, "second", "--sizes", "1000", "--limit", "128")
    assert second["stats"]["fallbacks"] == 1
    assert second["benchmarks"] == CONFIGS
    assert second["winners"]["1000"] in (64, 128)
    assert all(second["correct"].values())
    [warning] = _warnings(stderr)
    assert "failed to compile or launch" in warning and "OutOfResources" in warning


def test_configs_with_a_pre_hook_are_shared_and_the_winners_hook_still_runs(sqlite_url,
                                                                             tmp_path):
    first, _ = _job(sqlite_url, tmp_path, "first", "--sizes", "1000", "--config-hook")
    assert first["benchmarks"] == CONFIGS and first["stats"]["tuned"] == 1
    second, stderr = _job(sqlite_url, tmp_path, "second", "--sizes", "1000", "--config-hook")
    assert second["benchmarks"] == 0 and second["winners"] == first["winners"]
    assert second["hook_calls"] == 1  # the winner's own hook, before its launch
    assert all(second["correct"].values()) and _warnings(stderr) == []


def test_configs_only_their_hooks_tell_apart_are_left_to_triton(sqlite_url, tmp_path):
    report, stderr = _job(sqlite_url, tmp_path, "twins", "--sizes", "1000", "--twin-hooks")
    assert report["benchmarks"] == 2 and all(report["correct"].values())
    assert set(report["stats"].values()) == {0} and _warnings(stderr) == []
    assert not _sqlite_file(sqlite_url).exists()  # never even connected


def test_user_kernels_off_leaves_tritons_autotuner_alone(sqlite_url, tmp_path):
    report, stderr = _job(sqlite_url, tmp_path, "off", "--sizes", "1000",
                          TUNECACHE_SHARE="-user_kernels")
    assert report["benchmarks"] == CONFIGS and all(report["correct"].values())
    assert set(report["stats"].values()) == {0} and _warnings(stderr) == []
    assert not _sqlite_file(sqlite_url).exists()


def test_an_unusable_database_leaves_tuning_to_triton_with_one_warning(tmp_path):
    db = tmp_path / "tune.db"
    db.write_bytes(b"this is not a SQLite database" * 100)
    report, stderr = _job(str(db), tmp_path, "corrupt", "--sizes", "1000,3000")
    assert report["benchmarks"] == 2 * CONFIGS and all(report["correct"].values())
    assert report["stats"]["local"] == 2
    assert len(_warnings(stderr)) == 1, stderr


def _plant_all(db: str, fastest_block: int) -> None:
    """Every stored entry's timings rewritten so that ``fastest_block`` wins clearly."""
    for key_hash, stored in _user_kernel_rows(db):
        _set_timings(db, key_hash, {name: (0.001 if f'"BLOCK":{fastest_block},' in name else 1.0)
                                    for name in json.loads(stored)})


def _meta(db: str, size: int) -> dict:
    """The meta of the entry of a job at ``size``."""
    with tunecache.open(db) as cache:
        rows = cache.store.db.run(lambda c: c.execute(text(
            "SELECT key_json, meta_json FROM tunecache_entries WHERE kind = 'user_kernel'"
        )).fetchall())
    for key_json, meta_json in rows:
        if json.loads(key_json)["tuning_key"][0] == size:
            return json.loads(meta_json or "{}")
    raise AssertionError(f"no entry for size {size}")


def test_a_new_key_value_benchmarks_only_the_winners_of_its_two_nearest(sqlite_url, tmp_path):
    _job(sqlite_url, tmp_path, "record", "--sizes", "1000,4000")
    _plant_all(sqlite_url, 128)  # both neighbours' winner, by far
    on = {"TUNECACHE_LEVERS": "+user_kernel_transfer"}

    moved, stderr = _job(sqlite_url, tmp_path, "moved", "--sizes", "2000", **on)
    assert moved["benchmarks"] == 1 and moved["winners"] == {"2000": 128}
    assert moved["stats"]["transferred"] == 1 and all(moved["correct"].values())
    transfer = _meta(sqlite_url, 2000)["transfer"]
    assert (transfer["benchmarked"], transfer["generated"], len(transfer["from"])) == (1, 3, 2)
    assert _warnings(stderr) == []

    # more than three octaves from any recorded value: tuned in full
    far, _ = _job(sqlite_url, tmp_path, "far", "--sizes", "40000", **on)
    assert far["benchmarks"] == CONFIGS and far["stats"]["transferred"] == 0
    # off by default
    plain, _ = _job(sqlite_url, tmp_path, "plain", "--sizes", "3000")
    assert plain["benchmarks"] == CONFIGS and plain["stats"]["transferred"] == 0

    # A job asked to measure the regret benchmarks every config of the transferred key
    # once, records it, and still launches the stored winner.
    regret = {"TUNECACHE_LEVERS": "+user_kernel_regret"}
    measured, _ = _job(sqlite_url, tmp_path, "regret", "--sizes", "2000", **regret)
    assert measured["benchmarks"] == CONFIGS and measured["stats"]["regret_measured"] == 1
    assert measured["winners"] == {"2000": 128} and all(measured["correct"].values())
    meta = _meta(sqlite_url, 2000)
    assert meta["regret"] >= 1.0 and meta["exhaustive_ms"] > 0
    again, _ = _job(sqlite_url, tmp_path, "again", "--sizes", "2000", **regret)
    assert again["benchmarks"] == 0
    [moved_kind] = [k for k in run_json("stats", "--db", sqlite_url)["transferred"]["by_kind"]
                    if k["kind"] == "user_kernel"]
    assert (moved_kind["entries"], moved_kind["regret_measured"]) == (1, 1)


@pytest.mark.parametrize("recorded", ["1000", "1000,4000"], ids=["one", "one-planted"])
def test_a_key_value_with_one_usable_neighbour_is_tuned_in_full(sqlite_url, tmp_path, recorded):
    _job(sqlite_url, tmp_path, "record", "--sizes", recorded)
    if recorded != "1000":
        # The second neighbour names a config the kernel does not have: it is no neighbour.
        key_hash, stored = _user_kernel_rows(sqlite_url)[0]
        _set_timings(sqlite_url, key_hash, {**json.loads(stored), '{"EVIL":1}': 1e-6})
    report, _ = _job(sqlite_url, tmp_path, "moved", "--sizes", "2000",
                     TUNECACHE_LEVERS="+user_kernel_transfer")
    assert report["benchmarks"] == CONFIGS and report["stats"]["transferred"] == 0


def test_operators_list_prune_and_move_user_kernel_entries(sqlite_url, tmp_path):
    first, _ = _job(sqlite_url, tmp_path, "first", "--sizes", "1000")
    [row] = run_json("ls", "--db", sqlite_url, "--kind", "user_kernel")
    assert row["op"] == "__main__.accumulate"  # the kernel, by name
    [by_op] = [r for r in run_json("stats", "--db", sqlite_url)["by_op"]
               if r["kind"] == "user_kernel"]
    assert (by_op["op"], by_op["entries"]) == ("__main__.accumulate", 1)

    # exported and imported on another cluster's database: its jobs start tuned
    dump = tmp_path / "dump.jsonl"
    assert run("export", "--db", sqlite_url, "-o", str(dump)).exit_code == 0
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert run_json("import", "--db", other, str(dump))["new"] == 1
    moved, _ = _job(other, tmp_path, "moved", "--sizes", "1000")
    assert moved["benchmarks"] == 0 and moved["winners"] == first["winners"]

    assert run_json("prune", "--db", sqlite_url, "--kind", "user_kernel",
                    "--older-than", "0s")["deleted"] == 1
    assert _user_kernel_rows(sqlite_url) == []


# -- in this process: the key and what is patched


def test_a_configs_id_is_what_it_launches_with():
    from tunecache.user_kernels.tuning_keys import config_id

    a = triton.Config({"BLOCK": 64}, num_warps=4)
    assert config_id(a) == config_id(triton.Config({"BLOCK": 64}, num_warps=4))
    assert config_id(a) != config_id(triton.Config({"BLOCK": 64}, num_warps=8))
    assert json.loads(config_id(a)) == a.all_kwargs()


def test_tuning_values_keep_their_types():
    from tunecache.user_kernels.tuning_keys import tuning_values

    assert tuning_values((1, 1.0, True, "1", "torch.float16")) == \
        [1, 1.0, True, "1", "torch.float16"]
    assert tuning_values((float("nan"), None)) == ["float:nan", "NoneType:None"]


def test_enabling_and_disabling_leaves_tritons_autotuner_as_it_was(sqlite_url):
    from triton.runtime.autotuner import Autotuner

    import tunecache

    before = dict(Autotuner.__dict__)
    assert tunecache.enable(db=sqlite_url, only={"user_kernels"})
    try:
        assert Autotuner.__dict__["check_disk_cache"] is not before["check_disk_cache"]
        # Triton's own value is kept on the instance and read back once we are gone
        tuner = Autotuner(lambda: None, [], [], [], None, None)
        assert tuner.cache_results is True
    finally:
        tunecache.disable()
    assert dict(Autotuner.__dict__) == before
    assert tuner.cache_results is False


OLD_TORCH = "2.10.0"


def _aged(db: str, tmp: Path) -> str:
    """``db``'s entries as if recorded under torch :data:`OLD_TORCH` (tools/age_db.py), in
    a new database."""
    aged = f"sqlite:///{tmp / 'aged.db'}"
    subprocess.run([sys.executable, str(TESTS.parent / "tools" / "age_db.py"), db, aged,
                    "--torch", OLD_TORCH, "--kinds", "user_kernel"],
                   check=True, env=_env(db), stdout=subprocess.DEVNULL)
    return aged


def test_after_an_upgrade_a_key_benchmarks_only_its_old_winner_and_the_next_hits(
        sqlite_url, tmp_path):
    _job(sqlite_url, tmp_path, "record", "--sizes", "1000")
    _plant_all(sqlite_url, 128)  # the old winner, by far
    aged = _aged(sqlite_url, tmp_path)

    upgraded, stderr = _job(aged, tmp_path, "upgraded", "--sizes", "1000")
    assert upgraded["benchmarks"] == 1 and upgraded["winners"] == {"1000": 128}
    assert all(upgraded["correct"].values()) and _warnings(stderr) == []
    ours = [json.loads(t) for _, t in _user_kernel_rows(aged)]
    assert len(ours) == 2 and sorted(len(t) for t in ours) == [1, CONFIGS]
    with tunecache.open(aged) as cache:
        rows = cache.store.db.run(lambda c: c.execute(text(
            "SELECT torch_version, meta_json FROM tunecache_entries "
            "WHERE kind = 'user_kernel' AND torch_version != :old"), {"old": OLD_TORCH}
        ).fetchall())
    [(_, meta_json)] = rows
    moved = json.loads(meta_json)["transfer"]
    assert moved["from_version"]["torch"] == OLD_TORCH
    assert (moved["benchmarked"], moved["generated"], len(moved["from"])) == (1, CONFIGS, 1)

    again, _ = _job(aged, tmp_path, "again", "--sizes", "1000")
    assert again["benchmarks"] == 0 and again["winners"] == {"1000": 128}


def test_after_an_upgrade_configs_close_to_the_old_winner_are_benchmarked_with_it(
        sqlite_url, tmp_path):
    _job(sqlite_url, tmp_path, "record", "--sizes", "1000")
    [(key_hash, stored)] = _user_kernel_rows(sqlite_url)
    names = sorted(json.loads(stored))
    _set_timings(sqlite_url, key_hash, {names[0]: 1.0, names[1]: 1.1, names[2]: 2.0})
    upgraded, _ = _job(_aged(sqlite_url, tmp_path), tmp_path, "upgraded", "--sizes", "1000")
    assert upgraded["benchmarks"] == 2 and all(upgraded["correct"].values())


@pytest.mark.parametrize("planted", [
    {"foreign": '{"BLOCK":4096,"num_ctas":1,"num_stages":3,"num_warps":2}'},
    {"zero": 0.0}, {"nan": math.nan}, {"negative": -1.0}])
def test_after_an_upgrade_a_planted_old_record_is_no_source(sqlite_url, tmp_path, planted):
    _job(sqlite_url, tmp_path, "record", "--sizes", "1000")
    [(key_hash, stored)] = _user_kernel_rows(sqlite_url)
    names = sorted(json.loads(stored))
    [(kind, value)] = planted.items()
    timings = {names[0]: 0.001, names[1]: 1.0, names[2]: 1.0}
    if kind == "foreign":  # a config the kernel does not have, as the old winner
        timings = {value: 0.001, names[1]: 1.0, names[2]: 1.0}
    else:
        timings[names[0]] = value
    _set_timings(sqlite_url, key_hash, timings)
    upgraded, _ = _job(_aged(sqlite_url, tmp_path), tmp_path, "upgraded", "--sizes",
                            "1000")
    assert upgraded["benchmarks"] == CONFIGS and all(upgraded["correct"].values())
