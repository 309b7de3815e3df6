"""tools/decisive_regret.py: what deciding by neighbours alone would have cost, read from
the entries a transfer job measured at a new size (real SQLite files, written through the
public API as the integration writes them, read back by ``tunecache export``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tool_modules import TOOLS

import tunecache
from tunecache.inductor import transfer
from tunecache.inductor.triton import decisions
from tunecache.inductor.triton.decisions import Decision
from tunecache.keys import Key, canonical_json

TOOL = TOOLS / "decisive_regret.py"
ENV = {"device": "H200", "torch": "2.11"}


def _run(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(TOOL), *args, "--json"], check=True,
                          capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout)


def _publish(cache: tunecache.TuneCache, key: Key, timings: dict[str, float],
             meta: dict[str, Any]) -> None:
    claim = cache.claim(key)
    assert claim is not None and not isinstance(claim, tunecache.Result)
    assert cache.publish(claim, timings, tune_seconds=1.0, meta=meta) is not None


# ------------------------------------------------------------------------------ GEMMs

def _gemm_key(tokens: int) -> Key:
    inputs = repr([("cuda", "torch.bfloat16", tokens, 4096, 4096, 1, 0),
                   ("cuda", "torch.bfloat16", 4096, 4096, 1, 4096, 0)])
    key = {"kind": "gemm", "op": "mm", "inputs": inputs, "env": ENV}
    return Key.of(key, family=transfer.gemm_family(key))


def _template(block_m: int, even_k: bool = True) -> str:
    return (f"triton:triton_mm:ACC_TYPE='tl.float32', ALLOW_TF32=False, BLOCK_K=64, "
            f"BLOCK_M={block_m}, EVEN_K={even_k}, GROUP_M=8, num_stages=3, num_warps=4")


def _record_gemm(cache: tunecache.TuneCache, tokens: int, winner: int, margin: float) -> None:
    """A key tuned in full: template BLOCK_M=``winner`` first, by ``margin``."""
    others = [b for b in (64, 128, 256) if b != winner]
    timings = {_template(winner): 1.0, _template(others[0]): 1.0 + margin,
               _template(others[1]): 3.0, "extern:mm-aten": 2.5}
    _publish(cache, _gemm_key(tokens), timings, {})


def _transferred_gemm(cache: tunecache.TuneCache, tokens: int,
                      timings: dict[str, float]) -> None:
    """The key at a new size, as transfer measured it: a few candidates, even_k changed."""
    _publish(cache, _gemm_key(tokens), timings,
             {"transfer": {"from": ["a"], "benchmarked": len(timings),
                           "generated": len(timings)}})


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "transfer-4096.db")
    cache = tunecache.open(path)
    try:
        yield path, cache
    finally:
        cache.close()


def test_a_gemm_whose_neighbours_agree_costs_their_winners_time_over_the_fastest_here(db):
    path, cache = db
    _record_gemm(cache, 8192, winner=128, margin=0.5)
    _record_gemm(cache, 16384, winner=128, margin=0.3)
    # At 4096 tokens the neighbours' winner is 20 % slower than another template.
    _transferred_gemm(cache, 4096, {_template(128, even_k=False): 1.2,
                                    _template(64, even_k=False): 1.0,
                                    "extern:mm-aten": 2.0})
    out = _run(path)
    (row,) = out["would_decide"]
    assert (row["kind"], row["verdict"], row["neighbours"]) == ("gemm", "agree", 2)
    assert row["margin"] == pytest.approx(0.3)
    assert row["regret"] == pytest.approx(1.2)
    by_margin = {t["margin_at_least"]: t for t in out["thresholds"] if t["kind"] == "gemm"}
    assert (by_margin[0.25]["decided"], by_margin[0.25]["over_limit"]) == (1, 1)
    assert by_margin[0.25]["worst_regret"] == pytest.approx(1.2)
    assert by_margin[0.5]["decided"] == 0  # a margin of 0.5 would not have decided it


def test_a_gemm_whose_neighbours_agree_on_its_fastest_choice_has_no_regret(db):
    path, cache = db
    _record_gemm(cache, 8192, winner=128, margin=0.5)
    _transferred_gemm(cache, 4096, {_template(128, even_k=False): 1.0,
                                    _template(64, even_k=False): 1.1})
    (row,) = _run(path)["would_decide"]
    assert (row["verdict"], row["regret"]) == ("agree", 1.0)


def test_gemm_neighbours_that_disagree_or_were_transferred_decide_nothing(db):
    path, cache = db
    _record_gemm(cache, 8192, winner=128, margin=0.5)
    _record_gemm(cache, 16384, winner=64, margin=0.5)
    _transferred_gemm(cache, 4096, {_template(128, even_k=False): 1.0})
    _transferred_gemm(cache, 2048, {_template(128, even_k=False): 1.0})
    rows = {r["key_hash"]: r for r in _run(path)["would_decide"]}
    assert rows[_gemm_key(4096).hash]["verdict"] == "the neighbours disagree"
    # At 2048 the nearest neighbour is the transferred 4096 entry.
    assert rows[_gemm_key(2048).hash]["verdict"] == "a neighbour was itself transferred"
    assert all(r["regret"] is None for r in rows.values())


# ------------------------------------------------------------------- fusion decisions

SITE = {"gemm": {"inputs": [["torch.bfloat16", 2, [1, 0]]] * 2}, "epilogue": ["sum"]}


def _site(tokens: int) -> Key:
    return decisions.decision_key(ENV, SITE, [tokens, 4096, 4096])


def _decide(cache: tunecache.TuneCache, tokens: int, decision: Decision) -> None:
    assert decisions.settle(cache, _site(tokens), decision, [tokens, 4096, 4096]) == decision


def test_a_fusion_its_neighbours_would_have_made_where_not_fusing_won_costs_the_fused_time(
        db):
    path, cache = db
    _decide(cache, 8192, Decision.of(2.0, [1.0], rank=0))  # fused, by 100 %
    _decide(cache, 4096, Decision.of(1.0, [1.25], rank=None))  # here it does not pay
    (row,) = _run(path)["would_decide"]
    assert (row["kind"], row["verdict"]) == (decisions.DECISION_KIND, "agree")
    assert (row["choice"], row["measured"]) == ("fused, rank 0", "not fused")
    assert row["margin"] == pytest.approx(1.0)
    assert row["regret"] == pytest.approx(1.25)


def test_a_fusion_decision_the_new_size_repeats_has_no_regret(db):
    path, cache = db
    _decide(cache, 8192, Decision.of(2.0, [1.0], rank=0))
    _decide(cache, 4096, Decision.of(1.5, [1.0], rank=0))
    (row,) = _run(path)["would_decide"]
    assert row["regret"] == 1.0


# -------------------------------------------------------------------- Triton kernels

def _config(xblock: int, warps: int) -> dict[str, Any]:
    return {"XBLOCK": xblock, "num_warps": warps, "num_stages": 1}


def _kernel_key(tokens: int) -> Key:
    return Key.of({"kind": "triton_config", "op": "triton_poi_fused_mul_silu_0",
                   "env": ENV, "inductor_key": f"configs-of-{tokens}"}, family="5" * 64)


def _kernel(cache: tunecache.TuneCache, tokens: int, best: dict[str, Any],
            **meta: Any) -> None:
    entry = {**best, "configs_hash": f"configs-of-{tokens}", "found_by_coordesc": True,
             "triton_cache_hash": None}
    _publish(cache, _kernel_key(tokens), {canonical_json(entry): 2.0},
             {"sizes": {"x": tokens * 4096}, **meta})


# A timed config whose time is no positive number (0, negative) is left out: it neither
# becomes the fastest nor makes the kernel's regret unknown.
@pytest.mark.parametrize("unusable_ms", [[], [0.0, -1.0]],
                         ids=["every time usable", "a zero and a negative time left out"])
def test_a_triton_kernel_whose_neighbours_config_lost_here_costs_its_timed_ratio(
        db, unusable_ms):
    path, cache = db
    _kernel(cache, 8192, _config(256, 4), best_ms=1.0)
    # At 4096 transfer timed the start config and the neighbour's; the start won.
    timed = [{"config": _config(1024, 8), "ms": 1.0}, {"config": _config(256, 4), "ms": 1.3}]
    timed += [{"config": _config(512 * 2**i, 4), "ms": ms} for i, ms in enumerate(unusable_ms)]
    _kernel(cache, 4096, _config(1024, 8), best_ms=1.0, transfer={
        "from": ["a"], "benchmarked": len(timed), "generated": len(timed), "timed": timed})
    (row,) = _run(path)["would_decide"]
    assert (row["kind"], row["verdict"]) == ("triton_config", "agree")
    assert row["regret"] == pytest.approx(1.3)


def test_a_triton_kernel_that_kept_its_neighbours_config_has_no_regret(db):
    path, cache = db
    _kernel(cache, 8192, _config(256, 4))
    _kernel(cache, 4096, _config(256, 4), transfer={
        "from": ["a"], "benchmarked": 2, "generated": 2,
        "timed": [{"config": _config(1024, 8), "ms": 1.4},
                  {"config": _config(256, 4), "ms": 1.0}]})
    (row,) = _run(path)["would_decide"]
    assert row["regret"] == 1.0


# --------------------------------------------- a decisive job beside the transfer job

def test_what_a_decisive_job_decided_is_costed_by_what_the_job_beside_it_measured(tmp_path):
    recorded = str(tmp_path / "recorded.db")
    with tunecache.open(recorded) as cache:
        _record_gemm(cache, 8192, winner=128, margin=0.5)
        _decide(cache, 8192, Decision.of(2.0, [1.0], rank=0))
    measured, decisive = tmp_path / "transfer-4096.db", tmp_path / "decisive-4096.db"
    measured.write_bytes(Path(recorded).read_bytes())
    decisive.write_bytes(Path(recorded).read_bytes())
    with tunecache.open(str(measured)) as cache:
        _transferred_gemm(cache, 4096, {_template(128, even_k=False): 1.1,
                                        _template(64, even_k=False): 1.0})
        _decide(cache, 4096, Decision.of(1.5, [1.0], rank=0))
    with tunecache.open(str(decisive)) as cache:
        # The decided GEMM entry: the one choice, the neighbour's time, ATen not run.
        _publish(cache, _gemm_key(4096), {_template(128, even_k=False): 1.0,
                                          "extern:mm-aten": math.inf},
                 {"transfer": {"from": ["a"], "benchmarked": 0, "generated": 1}})
        assert decisions.decided_by_neighbours(cache, _site(4096), [4096, 4096, 4096])
    out = _run(str(measured), "--decisive", str(decisive))
    rows = {r["kind"]: r for r in out["decided"]}
    assert set(rows) == {"gemm", decisions.DECISION_KIND}
    assert rows["gemm"]["regret"] == pytest.approx(1.1)
    assert rows[decisions.DECISION_KIND]["regret"] == 1.0
    assert out["decided_summary"]["gemm"]["over_limit"] == 1


def test_the_report_prints_for_a_reader(db):
    path, cache = db
    _record_gemm(cache, 8192, winner=128, margin=0.5)
    _transferred_gemm(cache, 4096, {_template(128, even_k=False): 1.0})
    text = subprocess.run([sys.executable, str(TOOL), path], check=True,
                          capture_output=True, text=True, timeout=120).stdout
    assert "agree" in text and "margin >= 0.25: decided 1" in text


def test_a_database_that_cannot_be_exported_is_a_one_line_error(tmp_path):
    not_a_db = tmp_path / "notes.db"
    not_a_db.write_text("this is not a database\n" * 100)
    done = subprocess.run([sys.executable, str(TOOL), str(not_a_db)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"decisive_regret: cannot export {not_a_db}")
