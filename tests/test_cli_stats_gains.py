"""`tunecache stats`: what tuning bought (the untuned choice's time against the tuned
winner's, per kind, per op and for the top keys) and how transferred entries did."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path

import gain_entries
import pytest
from cli_helpers import run, run_json, strict_json
from test_cli_hostile_rows import HOSTILE, _assert_clean, _set_entries

import tunecache
from tunecache.keys import key_hash


def _key(op: str, i: int, kind: str = "gemm") -> dict:
    return {"kind": kind, "op": op, "inputs": i, "env": {"device": "cpu-x", "torch": "2.13.0"}}


def _publish(url: str, key: dict, timings: dict, meta: dict | None = None,
             tune_seconds: float = 0.0) -> str:
    with tunecache.open(url) as cache:
        claim = cache.claim(key)
        assert claim is not None
        assert cache.publish(claim, timings, meta=meta, tune_seconds=tune_seconds) is not None
    return key_hash(key)[0]


def test_stats_reports_what_tuning_bought_per_kind_op_and_top_keys(db_url):
    # GEMM without meta: the fastest extern candidate is the baseline, min(timings) best.
    _publish(db_url, _key("mm", 0), {"extern:aten_mm": 4.0, "extern:aten_mm2": 3.0,
                                      "triton:mm:a": 1.0, "triton:mm:b": None}, tune_seconds=2)
    # GEMM with meta: meta wins over the timings.
    big = _publish(db_url, _key("bmm", 1), {"extern:aten_bmm": 9.0, "triton:bmm:a": 2.0},
                   meta={"baseline": {"candidate": "extern:aten_bmm", "ms": 10.0},
                         "best_ms": 2.0}, tune_seconds=3)
    # Triton kernel: meta only.
    _publish(db_url, _key("kern", 2, "triton_config"), {"c1": 1.0, "c2": 1.5},
             meta={"baseline": {"candidate": "heuristic", "ms": 1.5}, "best_ms": 1.0},
             tune_seconds=5)
    # Not counted: a Triton entry without meta, a GEMM without an extern candidate.
    _publish(db_url, _key("kern", 3, "triton_config"), {"c1": 1.0})
    _publish(db_url, _key("mm", 4), {"triton:mm:a": 1.0, "triton:mm:b": 2.0})

    gains = run_json("stats", "--db", db_url)["gains"]
    assert (gains["rows_parsed"], gains["skipped"]) == (0, 0)  # every publish set the columns
    total = gains["total"]
    assert (total["entries"], total["baseline_ms"], total["best_ms"]) == (3, 14.5, 4.0)
    assert total["speedup"] == pytest.approx(14.5 / 4.0)
    assert total["ms_saved_per_call"] == pytest.approx(10.5)
    assert total["tune_seconds"] == pytest.approx(10.0)
    kinds = {r["kind"]: r for r in gains["by_kind"]}
    assert (kinds["gemm"]["entries"], kinds["gemm"]["baseline_ms"]) == (2, 13.0)
    assert kinds["triton_config"]["speedup"] == pytest.approx(1.5)
    assert [(r["kind"], r["op"]) for r in gains["by_op"]] == [
        ("gemm", "bmm"), ("gemm", "mm"), ("triton_config", "kern")]
    top = gains["top_keys"]
    assert top[0]["key_hash"] == big
    assert [t["ms_saved_per_call"] for t in top] == [8.0, 2.0, 0.5]
    mm = top[1]
    assert (mm["baseline_candidate"], mm["from"], mm["tune_seconds"]) == (
        "extern:aten_mm2", "timings", 2.0)

    out = run("stats", "--db", db_url).stdout
    assert "bought    3 entries with a baseline" in out
    assert "top keys by time gained per call:" in out and big[:12] in out


def test_stats_counts_transferred_entries_and_their_regret(db_url):
    moved = {"from": ["a" * 64], "benchmarked": 3, "generated": 30}
    _publish(db_url, _key("mm", 0), {"extern:a": 2.0, "triton:b": 1.0},
             meta={"transfer": moved, "regret": 1.25, "exhaustive_ms": 0.8})
    _publish(db_url, _key("mm", 1), {"extern:a": 2.0, "triton:b": 1.0},
             meta={"transfer": moved, "regret": 1.0})
    _publish(db_url, _key("mm", 2), {"extern:a": 2.0}, meta={"transfer": moved})
    _publish(db_url, _key("k", 3, "triton_config"), {"c": 1.0}, meta={"transfer": moved})
    _publish(db_url, _key("mm", 4), {"extern:a": 2.0})  # tuned in full: not transferred
    data = run_json("stats", "--db", db_url)["transferred"]
    kinds = {r["kind"]: r for r in data["by_kind"]}
    gemm = kinds["gemm"]
    assert (gemm["entries"], gemm["benchmarked"], gemm["generated"]) == (3, 9, 90)
    assert gemm["regret_measured"] == 2
    assert gemm["regret_mean"] == pytest.approx(1.125) and gemm["regret_max"] == 1.25
    assert (kinds["triton_config"]["entries"], kinds["triton_config"]["regret_mean"]) == (1, None)
    out = run("stats", "--db", db_url).stdout
    assert "transfer  gemm 3 (9 of 90 candidates benchmarked; 2 re-tuned in full, regret " \
           "mean 1.12, max 1.25)" in out


@pytest.mark.parametrize("meta_json,timings_json", [
    ("not json", None), ("[1, 2]", None), ('{"baseline": "fast", "best_ms": 1}', None),
    ('{"baseline": {"ms": "fast"}, "best_ms": 1}', "garbage"),
    ('{"baseline": {"ms": 2}, "best_ms": true}', '{"extern:a": "x"}'),
    ('{"baseline": {"ms": 1e999}, "best_ms": 0}', '[]'),
    ('{"transfer": [1], "regret": "high"}', None),
    ('{"transfer": {"benchmarked": "many", "generated": -4}, "regret": -1}', None),
    ('{' * 5000 + '}' * 5000, '[' * 5000 + ']' * 5000),
])
def test_stats_skips_rows_whose_meta_or_timings_are_garbled(db_url, meta_json, timings_json):
    good = _publish(db_url, _key("mm", 0), {"extern:a": 2.0, "triton:b": 1.0})
    bad = _publish(db_url, _key("mm", 1), {"extern:a": 2.0, "triton:b": 1.0})
    hostile = _publish(db_url, _key("k", 2, "triton_config"), {"c": 1.0})
    values = {"meta_json": meta_json}
    if timings_json is not None:
        values["timings_json"] = timings_json
    _set_entries(db_url, bad, **values)
    _set_entries(db_url, hostile, meta_json=meta_json, op=HOSTILE)
    for args in ((), ("--json",)):
        result = run("stats", "--db", db_url, *args)
        assert result.exit_code == 0, result.output
        _assert_clean(result.stdout)
    data = run_json("stats", "--db", db_url)
    top = {t["key_hash"] for t in data["gains"]["top_keys"]}
    assert good in top and hostile not in top
    for row in data["transferred"]["by_kind"]:
        assert row["regret_measured"] == 0


def test_stats_escapes_hostile_names_in_what_tuning_bought(db_url):
    h = _publish(db_url, _key("k", 0, "triton_config"), {"c": 1.0},
                 meta={"baseline": {"candidate": HOSTILE, "ms": 2.0}, "best_ms": 1.0,
                       "transfer": {"from": []}})
    _set_entries(db_url, h, kind=HOSTILE, op=HOSTILE)
    result = run("stats", "--db", db_url)
    assert result.exit_code == 0, result.output
    _assert_clean(result.stdout)
    assert "bought    1 entry with a baseline" in result.stdout


def _strict_stats(url: str) -> dict:
    """stats and stats --json exit 0; the JSON, parsed strictly."""
    human = run("stats", "--db", url)
    assert human.exit_code == 0, human.output
    result = run("stats", "--db", url, "--json")
    assert result.exit_code == 0, result.output
    return strict_json(result.stdout)


# Texts a writer of the shared database can plant, which no tunecache writer stores: each
# must cost its own row only (counted as skipped, summed nowhere), never the command.
TEN_TO_309 = "1" + "0" * 309  # 310 digits: float() of it overflows
DIGITS_4300 = "9" * 4300  # past Python's int-to-text limit
PLANTED = {
    "a_310_digit_timing": ("gemm", f'{{"extern:a": {TEN_TO_309}, "triton:b": 1.0}}', None),
    "a_310_digit_meta_number": (
        "triton_config", None,
        f'{{"baseline": {{"ms": {TEN_TO_309}}}, "best_ms": 1.0, "regret": {TEN_TO_309},'
        f' "transfer": {{"benchmarked": {TEN_TO_309}, "generated": 1}}}}'),
    "a_4300_digit_transfer_benchmarked": (
        "triton_config", None,
        f'{{"transfer": {{"benchmarked": {DIGITS_4300}, "generated": 3}}}}'),
    "nan_in_meta": ("triton_config", None,
                    '{"baseline": {"ms": NaN}, "best_ms": 1.0, "regret": NaN, '
                    '"transfer": {"benchmarked": 1, "generated": 2}}'),
    "infinity_in_meta": ("gemm", '{"extern:a": 2.0, "triton:b": 1.0}',
                         '{"baseline": {"ms": Infinity}, "best_ms": 1.0, "regret": Infinity, '
                         '"transfer": {"benchmarked": 1, "generated": 2}}'),
}


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_stats_skips_a_planted_row_with_an_out_of_range_number_and_sums_the_rest(db_url,
                                                                                  planted):
    kind, timings_json, meta_json = PLANTED[planted]
    good = _publish(db_url, _key("mm", 0), {"extern:a": 2.0, "triton:b": 1.0}, tune_seconds=1)
    # Two planted rows (two 4300-digit values made stats raise where one did not).
    for i in (1, 2):
        h = _publish(db_url, _key("k", i, kind), {"extern:a": 2.0, "triton:b": 1.0})
        values = {"meta_json": meta_json, "gain_state": None}  # as if no tunecache wrote it
        if timings_json is not None:
            values["timings_json"] = timings_json
        _set_entries(db_url, h, **values)
    data = _strict_stats(db_url)
    gains = data["gains"]
    assert (gains["rows_parsed"], gains["skipped"]) == (2, 2)
    total = gains["total"]
    assert (total["entries"], total["baseline_ms"], total["best_ms"]) == (1, 2.0, 1.0)
    assert [t["key_hash"] for t in gains["top_keys"]] == [good]
    assert data["transferred"]["by_kind"] == []
    assert "2 entries skipped (their meta or timings do not read)" in run(
        "stats", "--db", db_url).stdout


def test_stats_json_is_standard_json_when_stored_times_are_infinite_or_denormal(db_url):
    # A denormal best time makes an infinite speedup; an infinite tuning time (PostgreSQL's
    # floats and SQLite's REAL hold one) an infinite sum. --json printed them as Infinity.
    tiny = _publish(db_url, _key("k", 0, "triton_config"), {"c": 1.0},
                    meta={"baseline": {"ms": 2.0}, "best_ms": 5e-324})
    h = _publish(db_url, _key("mm", 1), {"extern:a": 2.0, "triton:b": 1.0}, tune_seconds=3)
    _set_entries(db_url, h, tune_seconds=float("inf"))
    data = _strict_stats(db_url)
    assert data["gains"]["top_keys"][0]["key_hash"] == tiny
    assert data["gains"]["top_keys"][0]["speedup"] is None  # inf: null, not Infinity
    assert data["tune_seconds"] == 0.0  # the infinite time is summed nowhere


def test_stats_of_a_database_upgraded_from_schema_0006_equal_a_fresh_ones(tmp_path):
    """Migration 0007 computes the gain columns of the entries already there, with the
    function every writer uses; a row whose meta does not read is counted, not summed."""
    old = tmp_path / "old.db"
    shutil.copyfile(Path(__file__).parent / "data" / "schema-0006.db", old)
    with contextlib.closing(sqlite3.connect(old)) as conn, conn:
        # Planted before the upgrade, on the one entry that has no baseline anyway.
        conn.execute("UPDATE tunecache_entries SET meta_json = '{\"best_ms\": NaN}' "
                     "WHERE json_extract(key_json, '$.i') = 1")
    assert run("upgrade", "--db", str(old)).exit_code == 0
    fresh = tmp_path / "fresh.db"
    with tunecache.open(str(fresh)) as cache:
        gain_entries.write(cache)
    upgraded, new = run_json("stats", "--db", str(old)), run_json("stats", "--db", str(fresh))
    assert (upgraded["gains"].pop("skipped"), new["gains"].pop("skipped")) == (1, 0)
    assert upgraded["gains"]["rows_parsed"] == new["gains"]["rows_parsed"] == 0
    assert upgraded["gains"]["total"]["entries"] == 3
    assert (upgraded["gains"], upgraded["transferred"]) == (new["gains"], new["transferred"])


def test_a_meta_update_recomputes_the_gain_columns_stats_sums(db_url):
    # As `warm --exhaustive` records a transferred entry's regret after the fact.
    key = _key("mm", 0)
    _publish(db_url, key, {"extern:a": 2.0, "triton:b": 1.0},
             meta={"transfer": {"from": [], "benchmarked": 1, "generated": 4}})
    with tunecache.open(db_url) as cache:
        assert cache.update_meta(key, regret=1.5)
    data = run_json("stats", "--db", db_url)
    assert data["gains"]["rows_parsed"] == 0  # the columns were written with the meta
    [gemm] = data["transferred"]["by_kind"]
    assert (gemm["regret_measured"], gemm["regret_max"]) == (1, 1.5)
    assert data["gains"]["total"]["baseline_ms"] == 2.0  # still from the timings
