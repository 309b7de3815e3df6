"""`tunecache stats`' headline and the jobs' reports (tunecache_usage) it sums: the three
lines first, --since, the per-day view, and planted report rows that cost only themselves."""

from __future__ import annotations

import time

from cli_helpers import run, run_json, strict_json
from sqlalchemy import delete, insert
from test_cli_hostile_rows import _db
from test_cli_stats_gains import _key, _publish

from tunecache.store.schema import usage

DAY = 86400.0


def _reports(url: str, *rows: dict) -> None:
    """Replace the jobs' reports with ``rows`` (each: its fields over a zero report)."""
    db = _db(url)
    base = {"recorded_at": time.time(), "host": "node1", "pid": 1, "hits": 0, "tuned": 0,
            "peer": 0, "local": 0, "seconds_saved": 0.0, "seconds_tuning": 0.0}
    db.run(lambda c: c.execute(delete(usage)), write=True)
    if rows:
        db.run(lambda c: c.execute(insert(usage), [{**base, **r} for r in rows]), write=True)
    db.dispose()


def _strict(url: str, *args: str) -> dict:
    human = run("stats", "--db", url, *args)
    assert human.exit_code == 0, human.output
    result = run("stats", "--db", url, "--json", *args)
    assert result.exit_code == 0, result.output
    return strict_json(result.stdout)


def test_planted_report_rows_out_of_bounds_are_counted_apart_and_never_summed(db_url):
    # Two reports of 2^62 hits overflowed SQLite's SUM ("integer overflow"), two of 1e308
    # seconds PostgreSQL's ("value out of range: overflow"): stats exited 1 until they were
    # deleted. (PostgreSQL's hits column is 32-bit: a negative count stands in there.)
    sqlite = db_url.startswith("sqlite")
    huge = 2**62 if sqlite else -5
    _publish(db_url, _key("mm", 0), {"extern:a": 2.0, "triton:b": 1.0}, tune_seconds=1)
    _reports(db_url, {"hits": 3, "peer": 1, "tuned": 2, "seconds_saved": 40.0,
                      "seconds_tuning": 90.0},
             {"hits": huge}, {"hits": huge},
             {"seconds_saved": 1e308}, {"seconds_saved": 1e308},
             {"seconds_tuning": float("inf")}, {"recorded_at": -1.0})
    for args in ((), ("--since", "7d"), ("--by-day",)):
        data = _strict(db_url, *args)
        u = data["usage"]
        assert (u["reports"], u["hits"], u["peer"], u["tuned"], u["invalid"]) == (1, 3, 1, 2, 6)
        assert (u["seconds_saved"], u["seconds_tuning"]) == (40.0, 90.0)
    assert [d["reports"] for d in data["by_day"]] == [1]
    out = run("stats", "--db", db_url).stdout
    assert ("processes 1 report: 3 cache hits, 1 peers' results, 2 tuned, 0 tuned without "
            "the database; compile time avoided 40.0s, tuning 1m 30s; 6 reports with counts "
            "or times no job records (not counted)") in out.splitlines()


def test_stats_opens_with_three_lines_in_plain_units_and_json_has_them(db_url):
    _publish(db_url, _key("mm", 0), {"extern:a": 20000.0, "triton:b": 5000.0}, tune_seconds=1)
    _publish(db_url, _key("mm", 1), {"extern:a": 0.00042, "triton:b": 0.00021})
    _reports(db_url, {"hits": 1200, "peer": 34, "seconds_saved": 7500.0},
             {"tuned": 120, "local": 3, "seconds_tuning": 2110.0})
    lines = run("stats", "--db", db_url).stdout.splitlines()
    assert lines[:3] == [
        "avoided   2h 05m of compile time, by 1234 results from the database (cache hits "
        "and peers' results)",
        "spent     35m 10s tuning, 123 keys tuned",
        "gained    tuned kernels 4.00x as fast as untuned: one call of each of 2 stored "
        "entries 5.0s against 20.0s, 15.0s gained per call"]
    assert lines[3].startswith("database  ")
    assert "e+" not in "\n".join(lines) and "e-0" not in "\n".join(lines)
    headline = _strict(db_url)["headline"]
    assert headline == {
        "compile_seconds_avoided": 7500.0, "results_served": 1234,
        "tuning_seconds_spent": 2110.0, "keys_tuned": 123, "entries_with_baseline": 2,
        "untuned_ms_per_call": 20000.00042, "tuned_ms_per_call": 5000.00021,
        "ms_gained_per_call": 20000.00042 - 5000.00021,
        "speedup": 20000.00042 / 5000.00021, "since_seconds": None}


def test_the_gains_tables_never_print_e_notation(db_url):
    _publish(db_url, _key("mm", 0), {"extern:a": 0.00042, "triton:b": 0.00021})
    out = run("stats", "--db", db_url).stdout
    assert "bought    1 entry with a baseline: one call of each 0.000420 ms untuned, " \
           "0.000210 ms tuned (2.00x, 0.000210 ms gained), found in 0.0s of tuning" in out
    assert "e-0" not in out


def test_since_counts_only_the_reports_of_the_window_and_by_day_lists_them(db_url):
    now = time.time()
    _reports(db_url,
             {"recorded_at": now - 10 * DAY, "hits": 100, "seconds_saved": 1000.0},
             {"recorded_at": now - 2 * DAY, "hits": 5, "seconds_saved": 50.0},
             {"recorded_at": now - 2 * DAY, "tuned": 4, "seconds_tuning": 20.0},
             {"recorded_at": now, "hits": 1, "peer": 2, "seconds_saved": 6.0})
    every = _strict(db_url)
    assert (every["usage"]["hits"], every["usage"]["reports"]) == (106, 4)
    week = _strict(db_url, "--since", "7d", "--by-day")
    assert (week["usage"]["hits"], week["usage"]["reports"]) == (6, 3)
    assert week["usage"]["since_seconds"] == 7 * DAY
    assert week["headline"]["results_served"] == 8
    assert week["headline"]["compile_seconds_avoided"] == 56.0

    def day(t: float) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(t))

    assert [(d["day"], d["reports"], d["hits"], d["peer"], d["tuned"], d["seconds_saved"],
             d["seconds_tuning"]) for d in week["by_day"]] == [
        (day(now), 1, 1, 2, 0, 6.0, 0.0), (day(now - 2 * DAY), 2, 5, 0, 4, 50.0, 20.0)]
    assert "by_day" not in every

    lines = run("stats", "--db", db_url, "--since", "7d", "--by-day").stdout.splitlines()
    assert lines[0] == ("avoided   56.0s of compile time in the last 7d, by 8 results from "
                        "the database (cache hits and peers' results)")
    assert lines[1] == "spent     20.0s tuning in the last 7d, 4 keys tuned"
    at = lines.index("by day (UTC, the jobs' reports):")
    assert lines[at + 1:] == [
        "  day         reports  cache hits  peers' results  tuned  avoided  tuning",
        f"  {day(now)}  1        1           2               0      6.0s     0.0s",
        f"  {day(now - 2 * DAY)}  2        5           0               4      50.0s    20.0s"]


def test_since_refuses_a_duration_without_a_unit(db_url):
    _reports(db_url)
    result = run("stats", "--db", db_url, "--since", "7")
    assert result.exit_code == 2
    assert "'7' has no unit: use s, m, h, d or w (7d is 7 days, 7s 7 seconds)" in result.stderr
    assert run_json("stats", "--db", db_url, "--since", "12h")["usage"]["since_seconds"] \
        == 12 * 3600.0
