"""After an upgrade: a GEMM key with no entry under this torch starts from its own entry
under an older one (tunecache/inductor/upgrade.py).

The version change is simulated as tools/age_db.py does it: a database recorded under this
torch is copied with every GEMM key relabelled as an older torch, so the job that reads it
is a job after an upgrade, on one torch. The lookup hook is driven with Inductor's real
selector and fake candidates (tests/test_gemm_transfer.py's), and real CPU jobs check the
whole path: the upgraded job benchmarks only what the old entries leave open, publishes
entries of its own version that name the old one, and the next job hits them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import inductor_fakes as fakes  # noqa: E402
from cli_helpers import run_json  # noqa: E402
from test_gemm_transfer import FakeTemplate, inputs_key, timings_by_name  # noqa: E402

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402
from tunecache.inductor import transfer, upgrade  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OLD_TORCH = "2.12.0+cpu"


@pytest.fixture(autouse=True)
def _own_inductor_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.fixture
def hooks_off():
    tunecache.reset_stats()
    yield
    tunecache.disable()
    tunecache.reset_stats()


def choices() -> list[Any]:
    return [fakes.FakeChoice("aten"), *(FakeTemplate(i) for i in range(8))]


def close_times() -> dict[str, float]:
    """Template 5 wins, 2 and 7 within the decisive margin of it, 0 just past it."""
    out = {"aten": 3.0, **{f"triton_mm_{i}": 2.0 + i for i in range(8)}}
    out.update(triton_mm_5=1.0, triton_mm_2=1.1, triton_mm_7=1.2, triton_mm_0=1.3)
    return out


def age(src: str, dst: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    subprocess.run([sys.executable, str(ROOT / "tools" / "age_db.py"), src, dst, "--torch",
                    OLD_TORCH], check=True, env=env, stdout=subprocess.DEVNULL)


def record_old(tmp_path: Path, dst: str, times: dict[str, float]) -> None:
    """A key tuned in full under this torch, then the database aged into ``dst``."""
    old = f"sqlite:///{tmp_path / 'old.db'}"
    assert tunecache.enable(db=old)
    calls: list[list[str]] = []
    fakes.lookup(choices(), "mm", inputs_key(1024), fakes.fake_benchmark(calls, times))
    assert len(calls[0]) == 9
    tunecache.disable()
    age(old, dst)


def entry(url: str, mapping: dict[str, Any]) -> Any:
    with tunecache.open(url) as cache:
        found = cache.lookup(mapping)
    assert found is not None
    return found


def new_key() -> dict[str, Any]:
    return tc_inductor.make_key("mm", inputs_key(1024), None, "cpu")


def old_key() -> dict[str, Any]:
    key = new_key()
    return {**key, "env": {**key["env"], "torch": OLD_TORCH}}


def test_after_an_upgrade_a_key_benchmarks_only_its_old_winners_and_aten(
        tmp_path, db_url, hooks_off):
    record_old(tmp_path, db_url, close_times())
    assert tunecache.enable(db=db_url)
    calls: list[list[str]] = []
    truth = {**close_times(), "triton_mm_7": 0.9}  # under the new torch, 7 wins
    found = timings_by_name(fakes.lookup(choices(), "mm", inputs_key(1024),
                                         fakes.fake_benchmark(calls, truth)))
    assert sorted(calls[0]) == ["aten", "triton_mm_2", "triton_mm_5", "triton_mm_7"]
    assert min(found, key=found.__getitem__) == "triton_mm_7"
    assert math.isinf(found["triton_mm_0"])
    stored = entry(db_url, new_key())
    moved = stored.meta["transfer"]
    assert moved["from_version"] == {"torch": OLD_TORCH}
    assert moved["from"] == [tunecache.keys.Key.of(old_key()).hash]
    assert moved["benchmarked"] == 4 and moved["generated"] == 9
    assert stored.best.startswith("triton:triton_mm:") and "BLOCK_M=2048" in stored.best
    # the next job hits the new version's entry
    tunecache.disable()
    assert tunecache.enable(db=db_url)
    again = timings_by_name(fakes.lookup(choices(), "mm", inputs_key(1024),
                                         fakes.fake_benchmark(calls, truth)))
    assert len(calls) == 1 and again == found
    # stats counts the entries of each torch; prune --keep-torch removes the old one and
    # leaves the upgraded entry, which still answers
    ours = str(torch.__version__)
    envs = {e["torch"]: e["entries"] for e in run_json("stats", "--db", db_url)[
        "by_environment"]}
    assert envs == {OLD_TORCH: 1, ours: 1}
    assert run_json("prune", "--db", db_url, "--keep-torch", ours)["deleted"] == 1
    assert entry(db_url, new_key()).timings == stored.timings


def test_an_old_winner_by_the_decisive_margin_is_taken_with_nothing_benchmarked(
        tmp_path, db_url, hooks_off):
    decisive = {**close_times(), "triton_mm_5": 0.5}  # 2.2x faster than the runner-up
    record_old(tmp_path, db_url, decisive)
    assert tunecache.enable(db=db_url)
    calls: list[list[str]] = []
    found = timings_by_name(fakes.lookup(choices(), "mm", inputs_key(1024),
                                         fakes.fake_benchmark(calls, close_times())))
    assert calls == []
    assert min(found, key=found.__getitem__) == "triton_mm_5"
    assert found["triton_mm_5"] == pytest.approx(0.5)
    stored = entry(db_url, new_key())
    assert stored.meta["transfer"]["benchmarked"] == 0
    assert stored.meta["transfer"]["from_version"] == {"torch": OLD_TORCH}
    assert list(stored.timings) == [stored.best]
    # with the decisive_gemm lever off, the old winner and its close rivals run
    tunecache.disable()
    other = f"sqlite:///{tmp_path / 'other.db'}"
    age(f"sqlite:///{tmp_path / 'old.db'}", other)
    assert tunecache.enable(db=other, levers="decisive_fusion,compile_ahead")
    fakes.lookup(choices(), "mm", inputs_key(1024), fakes.fake_benchmark(calls, close_times()))
    assert sorted(calls[0]) == ["aten", "triton_mm_5"]


def plant_old(url: str, timings: dict[str, float]) -> None:
    """An entry of the key under the older torch, written by anyone."""
    with tunecache.open(url) as cache:
        cache.get_or_tune(old_key(), lambda: timings)


@pytest.mark.parametrize("runner_up_ms", [5.0, 0.0105])
def test_a_planted_old_record_naming_a_foreign_winner_decides_nothing(
        tmp_path, db_url, hooks_off, runner_up_ms):
    ids = tc_inductor.candidate_ids(choices())
    foreign = "triton:triton_mm:ACC_TYPE='tl.float32', BLOCK_K=32, BLOCK_M=1, GROUP_M=8"
    # decisive by its margin (5.0) or with one of ours close behind it (0.0105)
    plant_old(db_url, {foreign: 0.01, ids[3]: runner_up_ms})
    assert tunecache.enable(db=db_url)
    calls: list[list[str]] = []
    fakes.lookup(choices(), "mm", inputs_key(1024),
                 fakes.fake_benchmark(calls, close_times()))
    assert len(calls[0]) == 9  # tuned in full
    assert "transfer" not in entry(db_url, new_key()).meta


@pytest.mark.parametrize("planted", ["zero", "huge", "nothing ran"])
def test_an_old_record_with_unusable_times_is_no_source(sqlite_url, hooks_off, planted):
    ids = tc_inductor.candidate_ids(choices())
    plant_old(sqlite_url, {"zero": {ids[6]: 0.0, ids[1]: 1.0},
                           "huge": {ids[6]: upgrade.MAX_MS * 2, ids[1]: 1.0},
                           "nothing ran": {ids[6]: math.inf}}[planted])
    assert tunecache.enable(db=sqlite_url)
    calls: list[list[str]] = []
    fakes.lookup(choices(), "mm", inputs_key(1024),
                 fakes.fake_benchmark(calls, close_times()))
    assert len(calls[0]) == 9  # tuned in full
    assert "transfer" not in entry(sqlite_url, new_key()).meta


def test_a_decision_names_exactly_one_of_the_calls_candidates():
    plan = upgrade.UpgradePlan(frozenset({"triton:t:A=1"}), ("h",), "triton:t:A=1", 0.5,
                               {"torch": OLD_TORCH})
    assert plan.decided_id(["extern:aten", "triton:t:A=1"]) == "triton:t:A=1"
    assert plan.decided_id(["extern:aten", "triton:t:A=2"]) is None
    assert plan.decided_id(["triton:t:A=1", "triton:t:A=1#2"]) == "triton:t:A=1"
    for ms in (0.0, -1.0, math.inf, math.nan, upgrade.MAX_MS * 2):
        assert dataclass_replace(plan, winner_ms=ms).decided_id(["triton:t:A=1"]) is None
    assert transfer.Plan(frozenset(), ()).decided_id(["triton:t:A=1"]) is None


def dataclass_replace(plan: Any, **fields: Any) -> Any:
    import dataclasses

    return dataclasses.replace(plan, **fields)


def test_only_older_versions_are_sources():
    assert upgrade.older(("2.13.0+cpu", "3.8.0"), ("2.14.1+cu130", "3.8.0"))
    assert upgrade.older(("2.14.1", "3.8.0"), ("2.14.1", "3.9.0"))
    assert upgrade.older(("2.13.0", "none"), ("2.15.0", "3.9.0"))
    assert not upgrade.older(("2.15.0", "3.9.0"), ("2.14.1", "3.8.0"))
    assert not upgrade.older(("2.14.1", "3.8.0"), ("2.14.1", "3.8.0"))
    assert not upgrade.older(("2.14.1+cpu", "3.8.0"), ("2.14.1+cu130", "3.8.0"))
    assert not upgrade.older(("garbage", "3.8.0"), ("2.14.1", "3.8.0"))


# -- real CPU jobs

def _job(tmp: Path, name: str, db: str, *extra: str, **env: str) -> dict[str, Any]:
    environ = {**os.environ, "TUNECACHE_DB": db, **env,
               "PYTHONPATH": os.pathsep.join(
                   [str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
               "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"inductor-{name}")}
    with open(tmp / f"{name}.log", "w") as log:
        done = subprocess.run(
            [sys.executable, str(HERE / "inductor_worker.py"), "--ops", "bmm,linear",
             "--out", str(tmp / f"{name}.json"), *extra],
            env=environ, stdout=subprocess.DEVNULL, stderr=log)
    assert done.returncode == 0, (tmp / f"{name}.log").read_text()[-3000:]
    return json.loads((tmp / f"{name}.json").read_text())


def _gemm_entries(url: str) -> list[tuple[dict[str, Any], Any]]:
    from sqlalchemy import select

    from tunecache.store.schema import entries

    with tunecache.open(url) as cache:
        keys = cache.store.db.run(lambda c: [json.loads(r[0]) for r in c.execute(
            select(entries.c.key_json).where(entries.c.kind == "gemm"))])
        return [(k, cache.lookup(k)) for k in keys]


@pytest.mark.timeout(1800)  # three compiling jobs in a row on a loaded 2-core machine
def test_a_job_after_an_upgrade_starts_from_the_old_entries_and_the_next_hits(
        tmp_path, db_url):
    old = f"sqlite:///{tmp_path / 'old.db'}"
    recorded = _job(tmp_path, "record", old)
    assert recorded["stats"]["tuned"] == 2
    age(old, db_url)
    aged = _gemm_entries(db_url)
    assert {k["env"]["torch"] for k, _ in aged} == {OLD_TORCH}
    # each old entry decides its key where its winner won by the decisive margin
    open_keys = 0
    for _, result in aged:
        winner = transfer.winner_and_margin(result.timings)
        assert winner is not None
        open_keys += winner[1] < transfer.DECISIVE_MARGIN
    upgraded = _job(tmp_path, "upgraded", db_url)
    stats = upgraded["stats"]
    assert stats["transferred_keys"] == 2 and stats["tuned"] == 2
    assert stats["benchmarks"] == open_keys
    new = [(k, r) for k, r in _gemm_entries(db_url) if k["env"]["torch"] != OLD_TORCH]
    assert len(new) == 2
    for key, result in new:
        assert key["env"]["torch"] == str(torch.__version__)
        moved = result.meta["transfer"]
        assert moved["from_version"] == {"torch": OLD_TORCH}
        assert moved["benchmarked"] in (0, 2) and moved["generated"] == 2
    for op, values in recorded["outputs"].items():
        assert upgraded["outputs"][op] == pytest.approx(values, rel=1e-4, abs=1e-5)
    again = _job(tmp_path, "again", db_url)
    assert again["stats"]["hits"] == 2 and again["stats"]["benchmarks"] == 0


def test_an_old_entry_transferred_in_full_decides_and_one_transferred_in_part_does_not():
    key = tunecache.keys.Key.of(new_key())
    ids = tc_inductor.candidate_ids(choices())
    timings = {ids[0]: 3.0, ids[6]: 1.0, ids[1]: 2.0}  # template 5 by 100%
    libraries = {"torch": OLD_TORCH}

    def plan(meta: dict[str, Any]) -> Any:
        record = tunecache.Neighbour("old", old_key(), timings, meta)
        found = upgrade.plan_upgrade(key, [(record, libraries)], decisive=True)
        assert found is not None and found.from_version == libraries
        return found.decided_id(ids)

    assert plan({}) == ids[6]
    assert plan({"transfer": {"benchmarked": 9, "generated": 9}}) == ids[6]
    assert plan({"transfer": {"benchmarked": 3, "generated": 9}}) is None
    assert plan({"transfer": {"benchmarked": 0, "generated": 1}}) is None
    assert plan({"transfer": {"benchmarked": True, "generated": True}}) is None
