"""`tunecache warm --exhaustive`: transferred GEMM entries re-tuned in full on CPU (real
Inductor autotune of bmm: ATen against the C++ bmm template), their regret recorded.

A "transferred" entry is made through the API: the real candidate ids of this machine's
key come from a plain warm-up (transfer off) into a scratch database; the entry published
in the database under test keeps only one of them, with a "transfer" meta.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from cli_helpers import populate, run, run_json
from test_cli_warm import WORKER_BMM, _finish, _warm, old_key

import tunecache
from tunecache.keys import Key, KeyLike, key_hash, top_up_key

pytest.importorskip("torch")

TRANSFER = {"from": ["0" * 64], "benchmarked": 1, "generated": 2}


def _real_entry(tmp: Path) -> tuple[dict, dict[str, float]]:
    """This machine's key for WORKER_BMM and its full timings, tuned with transfer off."""
    scratch = f"sqlite:///{tmp / 'scratch.db'}"
    populate(scratch, [old_key(WORKER_BMM)])
    report = _finish(_warm(tmp, scratch, TUNECACHE_SHARE="-transfer"))
    assert report["tuned"] == 1, report
    recorded = key_hash(old_key(WORKER_BMM))[0]
    with sqlite3.connect(tmp / "scratch.db") as conn:
        rows = conn.execute("SELECT key_hash, key_json, timings_json FROM tunecache_entries "
                            "WHERE state = 'done' AND key_hash != ?", (recorded,)).fetchall()
    assert len(rows) == 1, rows
    timings = json.loads(rows[0][2])
    assert len(timings) >= 2 and any(n.startswith("extern:") for n in timings), timings
    return json.loads(rows[0][1]), timings


# The factor by which a decided entry's stored time is too fast.
INFLATED = 1000.0
# The time published for a transferred entry's one candidate: far past anything this
# small bmm takes on CPU, so every candidate re-tuned here beats it and the regret shows
# it. Not a multiple of a recorded time: the C++ template's timing is bimodal on CPU (a
# few microseconds, or about 8 ms when a call pays a first-run cost), so a re-tuned
# candidate may be hundreds of times slower than when it was recorded.
PLANTED_MS = 10_000.0


def _publish_transferred(url: str, key: dict, timings: dict[str, float]) -> dict[str, float]:
    """Publish ``key`` with only its slowest candidate timed, and that time far too slow, as
    a transfer that missed the winner by far would; returns the subset published."""
    slowest = max(timings, key=lambda n: timings[n] if timings[n] is not None else -1)
    subset = {slowest: PLANTED_MS}
    with tunecache.open(url) as cache:
        claim = cache.claim(key)
        assert claim is not None
        assert cache.publish(claim, subset, meta={"transfer": TRANSFER}) is not None
    return subset


def _entry(url: str, key: KeyLike) -> tunecache.Result | None:
    with tunecache.open(url) as cache:
        return cache.lookup(key)


def test_warm_exhaustive_retunes_a_transferred_entry_in_full_and_records_its_regret(
        db_url, tmp_path):
    key, timings = _real_entry(tmp_path)
    subset = _publish_transferred(db_url, key, timings)
    h = key_hash(key)[0]

    dry = run_json("warm", "--db", db_url, "--exhaustive", "--dry-run")
    assert [t["key_hash"] for t in dry["tasks"]] == [h]
    assert dry["tasks"][0]["candidates"] == 1

    report = _finish(_warm(tmp_path, db_url, "--exhaustive"))
    assert (report["keys"], report["measured"], report["error"]) == (1, 1, 0), report
    task = report["tasks"][0]
    assert task["candidates_after"] == len(timings)
    # Every candidate re-tuned here beats the inflated one: the regret is its time over
    # theirs, so it is far above 1 (were the re-tuned timings not merged, it would be 1).
    assert task["regret"] > 10

    meta = _entry(db_url, key).meta
    assert meta["transfer"] == TRANSFER  # the provenance stays
    assert meta["regret"] == pytest.approx(task["regret"])
    assert meta["exhaustive_ms"] == pytest.approx(next(iter(subset.values())) / meta["regret"])
    assert isinstance(meta["exhaustive_at"], float)
    # The candidates the transfer skipped were tuned under the top-up key.
    missing = sorted(set(timings) - set(subset))
    top_up = _entry(db_url, top_up_key(Key.of(key), missing))
    assert top_up is not None and set(top_up.timings) == set(missing)
    assert meta["exhaustive_ms"] == pytest.approx(min(top_up.timings.values()))
    assert task["top_up_keys"] == [top_up.key_hash]

    # Measured: a second run finds nothing to do, unless --again.
    assert run_json("warm", "--db", db_url, "--exhaustive", "--dry-run")["keys"] == 0
    assert run_json("warm", "--db", db_url, "--exhaustive", "--dry-run",
                    "--again")["keys"] == 1
    stats = run_json("stats", "--db", db_url)
    [moved] = stats["transferred"]["by_kind"]
    assert (moved["kind"], moved["entries"], moved["regret_measured"]) == ("gemm", 1, 1)
    assert moved["regret_max"] == pytest.approx(meta["regret"])


def test_warm_exhaustive_times_a_decided_entrys_candidate_again(db_url, tmp_path):
    # Decided by its neighbours: one candidate, nothing benchmarked, and the neighbour's
    # time stored for it, here 1000 times too fast. Compared with that time, every
    # candidate would look slower and the regret would fall below 1.
    key, timings = _real_entry(tmp_path)
    fastest = min(timings, key=lambda n: timings[n] if timings[n] is not None else INFLATED)
    decided = {"from": ["0" * 64], "benchmarked": 0, "generated": 1}
    with tunecache.open(db_url) as cache:
        claim = cache.claim(key)
        assert claim is not None
        assert cache.publish(claim, {fastest: timings[fastest] / INFLATED},
                             meta={"transfer": decided}) is not None

    report = _finish(_warm(tmp_path, db_url, "--exhaustive"))
    assert (report["keys"], report["measured"], report["error"]) == (1, 1, 0), report
    # The top-up timed every candidate, the decided one too, and the regret is that
    # one's time here over the fastest's.
    top_up = _entry(db_url, top_up_key(Key.of(key), sorted(timings)))
    assert top_up is not None and set(top_up.timings) == set(timings)
    meta = _entry(db_url, key).meta
    assert meta["exhaustive_ms"] == pytest.approx(min(top_up.timings.values()))
    assert meta["regret"] == pytest.approx(top_up.timings[fastest] / meta["exhaustive_ms"])
    assert meta["regret"] >= 1.0


def test_warm_exhaustive_leaves_entries_of_another_environment_and_untransferred_ones(
        sqlite_url, tmp_path):
    # A transferred entry recorded under another torch: this machine computes another key.
    other = old_key(WORKER_BMM)
    with tunecache.open(sqlite_url) as cache:
        claim = cache.claim(other)
        cache.publish(claim, {"extern:x": 1.0}, meta={"transfer": TRANSFER})
    populate(sqlite_url, [old_key(WORKER_BMM, torch="2.11.0")])  # not transferred
    dry = run_json("warm", "--db", sqlite_url, "--exhaustive", "--dry-run")
    assert [t["key_hash"] for t in dry["tasks"]] == [key_hash(other)[0]]
    report = _finish(_warm(tmp_path, sqlite_url, "--exhaustive"))
    assert (report["keys"], report["other_environment"], report["measured"]) == (1, 1, 0)
    assert "regret" not in _entry(sqlite_url, other).meta
    human = run("warm", "--db", sqlite_url, "--exhaustive", "--dry-run")
    assert "would re-tune 1 transferred GEMM entries" in human.stdout


def test_warm_again_without_exhaustive_is_a_usage_error(sqlite_url):
    assert run("warm", "--db", sqlite_url, "--again").exit_code == 2
