"""Decisions taken without measuring trust only what was measured (issue 51, part 1): a
decision is one of the asking call's own candidates, from finite, positive, bounded times
(tunecache/measured.py), and a decided entry no compile can use is replaced by the first
job that measures its key instead of being warned about forever.

GEMM decisions are made before generation, which a CPU compile never reaches (its
lowerings pass only ATen through get_template_configs: tests/test_gemm_narrowing.py), so
they are driven with that file's real InductorChoices and fake Triton template; the
replacement of a planted entry runs with Inductor's real selector and fake candidates, and
in real CPU jobs. Every test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import inductor_fakes as fakes  # noqa: E402
from test_fusion_decisions import _key, _sizes, fusing  # noqa: E402,F401 - fixture
from test_gemm_narrowing import decisive, gemm  # noqa: E402,F401 - fixtures
from test_gemm_transfer import choices, inputs_key  # noqa: E402

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402
from tunecache import measured  # noqa: E402
from tunecache.inductor import transfer  # noqa: E402
from tunecache.inductor.transfer import gemm_family  # noqa: E402
from tunecache.keys import Key  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EVIL = "extern:evil"


@pytest.fixture
def gemm_db(db_url) -> str:
    return db_url


@pytest.fixture
def fusing_db(db_url) -> str:
    return db_url


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tunecache" and r.levelno >= logging.WARNING]


# -- the shared check


@pytest.mark.parametrize("ms", [0, 0.0, -1.0, math.nan, math.inf, 1e-300, 2.0**53, 1e308,
                                10**310, True, "1.0", None])
def test_what_is_no_measurement(ms):
    assert not measured.is_measured(ms)


def test_a_row_decides_only_where_every_time_it_holds_is_a_measurement():
    assert measured.all_measured({"a": 1.0, "b": math.inf})
    assert not measured.all_measured({"a": math.inf})
    assert not measured.all_measured({"a": 1.0, "b": 0.0})
    assert not measured.all_measured({"a": 1e-300, "b": 2.0**53})
    assert measured.margin(1.0, 1.5) == pytest.approx(0.5)
    assert measured.margin(0.0, 1.0) == 0.0 and measured.margin(1e-300, 2.0**53) == 0.0
    assert measured.one_of("x", ["x", "y"]) == "x"
    assert measured.one_of("x", ["y"]) is None and measured.one_of("x", ["x", "x"]) is None
    assert measured.within(2, 3) and not measured.within(3, 3)
    assert not measured.within(True, 3) and not measured.within(-1, 3)


@pytest.mark.parametrize("timings", [
    {"extern:a": 1e-300, "extern:b": 2.0**53},  # a margin of 2^53 over 1e-300
    {"extern:a": 0.0, "extern:b": 0.0},  # an infinite margin
    {"extern:a": 1.0, "extern:b": 4e6},  # a runner-up past an hour
])
def test_neighbours_whose_times_are_no_measurements_decide_nothing(timings):
    ranked = [tunecache.Neighbour(f"h{i}", {}, timings, {}) for i in range(3)]
    assert transfer.winner_and_margin(timings) is None
    assert transfer.neighbours_agreement(ranked).verdict != transfer.AGREE
    assert transfer.decisive_winner(ranked) is None


# -- GEMM: planted neighbours never decide a kernel the call lacks


def _ids(mm: Any) -> list[str]:
    """This mm's candidate ids (none of them names a size)."""
    tunecache.disable()  # every choice generated, nothing read or planned
    try:
        made = mm.compile()
    finally:
        assert tunecache.enable(mm.active)
    mm.generated.clear()
    return tc_inductor.candidate_ids(made)


def _plant_neighbours(mm: Any, timings: dict[str, float]) -> None:
    """Three rows of the new key's family (M=64, 256, 512 around M=128), written by
    anyone, then the fixture's hooks enabled afresh at M=128."""
    with tunecache.open(mm.cache.settings.db_url) as writer:
        for m in (64, 256, 512):
            mm.resize(m)
            mapping = mm.key()
            writer.get_or_tune(Key.of(mapping, family=gemm_family(mapping)),
                               lambda: timings)
    assert tunecache.enable(mm.active)
    mm.generated.clear()
    tunecache.reset_stats()
    mm.resize(128)


def _planted(name: str, ids: list[str]) -> dict[str, float]:
    extern = next(i for i in ids if i.startswith("extern:"))
    templates = [i for i in ids if not i.startswith("extern:")]
    if name == "agree on extern:evil":
        return {EVIL: 0.1, extern: 1.0, **{t: 2.0 for t in templates}}
    if name == "all 0, an unknown kernel first":
        return {EVIL: 0.0, extern: 0.0, **{t: 0.0 for t in templates}}
    # "2^53 over 1e-300": our own ATen kernel, by an absurd margin
    return {extern: 1e-300, **{t: 2.0**53 for t in templates}}


@pytest.mark.parametrize("planted", ["agree on extern:evil", "all 0, an unknown kernel first",
                                     "2^53 over 1e-300"])
def test_planted_neighbours_never_decide_a_new_key(decisive, planted):  # noqa: F811
    ids = _ids(decisive)
    _plant_neighbours(decisive, _planted(planted, ids))
    made = decisive.compile()
    assert tunecache.stats().gemm.as_dict()["choice_lists_decided"] == 0
    assert len(made) > 1  # a benchmark, never a decision
    entry = decisive.cache.lookup(decisive.key())
    assert entry is None or set(entry.timings) <= set(ids)


def test_neighbours_agreeing_on_the_calls_own_aten_kernel_still_decide(
        decisive):  # noqa: F811
    ids = _ids(decisive)
    extern = next(i for i in ids if i.startswith("extern:"))
    _plant_neighbours(decisive, {extern: 0.1, **{t: 2.0 for t in ids if t != extern}})
    made = decisive.compile()
    assert decisive.generated == [] and len(made) == 1
    entry = decisive.cache.lookup(decisive.key())
    assert entry is not None and set(entry.timings) == {extern}


def test_rows_of_another_gemm_structure_filed_under_this_family_are_no_neighbours(
        db_url):
    """The family column is what the row's writer put there; the row's own key says
    which family it is of."""
    ids = tc_inductor.candidate_ids(choices())
    timings = {i: 0.1 if n == 3 else 1.0 for n, i in enumerate(ids)}
    ours = tc_inductor.make_key("mm", inputs_key(2048), None, "cpu")
    family = gemm_family(ours)
    with tunecache.open(db_url) as cache:
        for m in (1024, 4096):
            other = tc_inductor.make_key("mm", inputs_key(m, transposed=True), None, "cpu")
            assert gemm_family(other) != family
            cache.get_or_tune(Key.of(other, family=family), lambda: timings)
        found = cache.neighbours(Key.of(ours, family=family))
    assert len(found) == 2  # the store reads them by the column
    assert transfer.plan_transfer(ours, found, decisive=True) is None


# -- a decided entry no compile can use is replaced by the first that measures


@pytest.fixture
def hooked(db_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    tunecache.reset_stats()
    yield db_url
    tunecache.disable()
    tunecache.reset_stats()


def _plant_decision(url: str, mapping: dict[str, Any], timings: dict[str, float]) -> None:
    """A decided entry (meta transfer, nothing benchmarked), as a neighbour-decided job
    publishes one."""
    key = Key.of(mapping, family=gemm_family(mapping))
    with tunecache.open(url) as writer:
        claim = writer.claim(key)
        assert claim is not None and not isinstance(claim, tunecache.Result)
        assert writer.publish(claim, timings, tune_seconds=0.0, meta={
            "transfer": {"from": ["planted"], "benchmarked": 0, "generated": 1}}) is not None


def test_a_decided_entry_naming_no_candidate_of_the_call_is_replaced_once(hooked, caplog):
    mapping = tc_inductor.make_key("mm", inputs_key(1024), None, "cpu")
    _plant_decision(hooked, mapping, {EVIL: 0.5})
    ids = tc_inductor.candidate_ids(choices())
    for job in range(2):
        assert tunecache.enable(db=hooked)
        calls: list[list[str]] = []
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            found = fakes.lookup(choices(), "mm", inputs_key(1024),
                                 fakes.fake_benchmark(calls, {"triton_mm_3": 0.1}))
        tunecache.disable()
        assert min(found.values()) == pytest.approx(0.1)
        if job == 0:  # re-tuned in full, one warning
            assert len(calls) == 1 and len(calls[0]) == len(ids)
            assert len(_warnings(caplog)) <= 1
        else:  # a plain hit
            assert calls == [] and _warnings(caplog) == []
    with tunecache.open(hooked) as cache:
        entry = cache.lookup(mapping)
    assert entry is not None and set(entry.timings) == set(ids)
    assert entry.meta.get("transfer", {}).get("benchmarked") != 0


def test_an_entry_whose_candidates_all_failed_is_not_tuned_again(hooked):
    """All inf is a measurement of these very candidates: replacing it would only fail
    again, in every job."""
    mapping = tc_inductor.make_key("mm", inputs_key(1024), None, "cpu")
    ids = tc_inductor.candidate_ids(choices())
    _plant_decision(hooked, mapping, {i: math.inf for i in ids})
    assert tunecache.enable(db=hooked)
    calls: list[list[str]] = []
    fakes.lookup(choices(), "mm", inputs_key(1024), fakes.fake_benchmark(calls, {}))
    tunecache.disable()
    with tunecache.open(hooked) as cache:
        entry = cache.lookup(mapping)
    assert entry is not None and all(math.isinf(v) for v in entry.timings.values())


# -- fusion decisions: ranks within the template's choices, neighbours by their own key


def _plant_sites(url: str, rank: int, site: Any = None) -> None:
    """Three sites around 4096 tokens that fused candidate ``rank`` by far; with
    ``site``, rows of that other site filed under this site's family."""
    from tunecache.inductor.triton import decisions

    with tunecache.open(url) as writer:
        for tokens in (2048, 8192, 16384):
            key = _key(tokens)
            if site is not None:
                other = decisions.decision_key({"device": "H200", "torch": "2.11"}, site,
                                               _sizes(tokens))
                key = Key.of(other.mapping, family=key.family)
            claim = writer.claim(key)
            assert claim is not None and not isinstance(claim, tunecache.Result)
            assert writer.publish(claim, {"unfused": 2.0, "fused": 1.0, "runner_up": 1.5},
                                  meta={"sizes": _sizes(tokens), "rank": rank}) is not None


def _fusion_warnings(caplog) -> list[str]:
    return [w for w in _warnings(caplog) if "fusion" in w]


@pytest.mark.parametrize("rank", [5, 63])
def test_neighbours_agreeing_on_a_rank_the_template_lacks_decide_nothing(
        fusing, caplog, rank):  # noqa: F811
    from tunecache.inductor.triton import decisions

    _plant_sites(fusing.cache.settings.db_url, rank)
    fusing.reopen(decisive=True)
    calls = fusing.inductor_calls
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        fused, template = fusing.decide(4096, [1.0, 1.3, 1.4])
    assert fusing.inductor_calls == calls + 1  # measured, not decided
    assert fused and template.finalized == "triton_mm_a"
    stored = decisions.stored_decision(fusing.cache, _key(4096))
    assert stored is not None and stored.rank == 0
    assert _fusion_warnings(caplog) == []


def test_rows_of_another_site_filed_under_this_family_decide_nothing(fusing):  # noqa: F811
    other = {"gemm": {"inputs": [["torch.float16", 2, [0, 1]]] * 2}, "epilogue": ["relu"]}
    _plant_sites(fusing.cache.settings.db_url, 0, site=other)
    fusing.reopen(decisive=True)
    calls = fusing.inductor_calls
    fusing.decide(4096, [5.0, 5.0, 5.0])
    assert fusing.inductor_calls == calls + 1


@pytest.mark.parametrize("rank", [5, 63])
def test_a_fusion_entry_no_process_can_follow_is_replaced_by_the_next_that_measures(
        fusing, caplog, rank):  # noqa: F811
    from tunecache.inductor.triton import decisions

    planted = decisions.Decision(2.0, 1.0, 1.5, rank)
    with tunecache.open(fusing.cache.settings.db_url) as writer:
        assert decisions.settle(writer, _key(4096), planted, _sizes(4096)) == planted
    fusing.reopen(decisive=True)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        fused, template = fusing.decide(4096, [1.0, 1.3, 1.4])
    assert fused and template.finalized == "triton_mm_a"
    assert len(_fusion_warnings(caplog)) <= 1
    stored = decisions.stored_decision(fusing.cache, _key(4096))
    assert stored is not None and stored.rank == 0
    caplog.clear()
    fusing.reopen(decisive=True)
    calls = fusing.inductor_calls
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        fused, template = fusing.decide(4096, [9.0, 9.0, 9.0], name="next-job")
    assert fused and template.finalized == "triton_mm_a"
    assert fusing.inductor_calls == calls  # replayed
    assert _fusion_warnings(caplog) == []


# -- real CPU jobs


def _env(tmp: Path, db: str, name: str) -> dict[str, str]:
    return {**os.environ, "TUNECACHE_DB": db,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE),
                                           os.environ.get("PYTHONPATH", "")]),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"inductor-{name}")}


def _job(tmp: Path, db: str, name: str) -> tuple[dict[str, Any], list[str]]:
    """One real CPU job compiling a bmm: its result and tunecache's warnings."""
    done = subprocess.run(
        [sys.executable, str(HERE / "inductor_worker.py"), "--ops", "bmm",
         "--out", str(tmp / f"{name}.json")],
        env=_env(tmp, db, name), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "tunecache:" in line]
    return json.loads((tmp / f"{name}.json").read_text()), warned


_BMM_KEY = """
import json, os, torch, tunecache
from tunecache import inductor
tunecache.enable()
m = int(os.environ["TOKENS"])
inputs = repr([("cpu", "torch.float32", 4, m, 48, m * 48, 48, 1, 0),
               ("cpu", "torch.float32", 4, 48, 40, 1920, 40, 1, 0)])
print(json.dumps(inductor.make_key("bmm", inputs, None, "cpu")))
"""


def _bmm_key(tmp: Path, tokens: int) -> dict[str, Any]:
    """The key inductor_worker.py's bmm looks up at ``tokens``, as a job computes it."""
    env = {**_env(tmp, f"sqlite:///{tmp / 'scratch.db'}", "key"), "TOKENS": str(tokens),
           "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}
    out = subprocess.run([sys.executable, "-c", _BMM_KEY], env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def _entry(url: str, mapping: dict[str, Any]) -> Any:
    with tunecache.open(url) as cache:
        return cache.lookup(mapping)


@pytest.mark.timeout(1800)
def test_a_planted_decision_is_replaced_by_the_next_real_job_and_the_one_after_hits(
        tmp_path, db_url):
    mapping = _bmm_key(tmp_path, 32)
    _plant_decision(db_url, mapping, {EVIL: 0.5})
    first, warned = _job(tmp_path, db_url, "first")
    assert [e["key_hash"] for e in first["stats"]["events"]] == [Key.of(mapping).hash]
    assert first["stats"]["tuned"] == 1 and first["stats"]["fallbacks"] == 0
    assert len(warned) <= 1
    entry = _entry(db_url, mapping)
    assert entry is not None and EVIL not in entry.timings and entry.best is not None
    second, warned = _job(tmp_path, db_url, "second")
    assert second["stats"]["hits"] == 1 and second["stats"]["benchmarks"] == 0
    assert warned == []
