"""tunecache stats, ls, show, upgrade, and the errors every command shares."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli_helpers import claim_key, fail_key, gemm_key, populate, run, run_json

from tunecache.store.migrate import head_revision

REPO = Path(__file__).resolve().parents[1]


def test_stats_counts_states_envs_ops_hits_and_claims(db_url):
    populate(db_url, [gemm_key("mm", i) for i in range(3)], hits=2)
    populate(db_url, [gemm_key("bmm", i, torch="2.12.0") for i in range(2)])
    fail_key(db_url, gemm_key("addmm", 9))
    claim_key(db_url, gemm_key("mm", 50), lease_seconds=600, owner="node7:123:live")
    claim_key(db_url, gemm_key("mm", 51), lease_seconds=0.01, owner="node8:9:dead")

    data = run_json("stats", "--db", db_url)
    assert data["entries"] == {"total": 8, "by_state": {"done": 5, "claimed": 2, "failed": 1}}
    assert data["hits"] == 6
    assert data["usage"]["hits"] == 6 and data["usage"]["tuned"] == 5
    envs = {(e["device"], e["torch"]): e["entries"] for e in data["by_environment"]}
    assert envs == {("cpu-x", "2.13.0"): 6, ("cpu-x", "2.12.0"): 2}
    ops = {e["op"]: (e["entries"], e["done"], e["hits"]) for e in data["by_op"]}
    assert ops == {"mm": (5, 3, 6), "bmm": (2, 2, 0), "addmm": (1, 0, 0)}
    assert data["claims"]["in_flight"] == 1 and data["claims"]["expired"] == 1
    assert [c["owner"] for c in data["claims"]["live"]] == ["node7:123:live"]
    assert data["failed"]["count"] == 1
    assert "kernel crashed" in data["failed"]["keys"][0]["error"]
    # seconds saved = sum(hits * tune_seconds) over entries
    assert data["seconds_saved"] > 0 and data["size"]["bytes"] > 0

    human = run("stats", "--db", db_url)
    assert human.exit_code == 0
    lines = human.stdout.splitlines()
    assert lines[4] == "entries   8 (done 5, claimed 2, failed 1)"
    assert lines[7] == "claims    1 in flight, 1 expired"
    assert lines[8] == "failed    1 key"
    assert "node7:123:live" in human.stdout


def test_ls_filters_and_show(db_url):
    results = populate(db_url, [gemm_key("mm", 0), gemm_key("bmm", 1, torch="2.12.0")])
    rows = run_json("ls", "--db", db_url, "--op", "bmm")
    assert [r["key_hash"] for r in rows] == [results[1].key_hash]
    assert run_json("ls", "--db", db_url, "--torch", "2.13.0")[0]["op"] == "mm"
    assert run_json("ls", "--db", db_url, "--state", "failed") == []
    assert len(run_json("ls", "--db", db_url, "--limit", "1")) == 1

    entry = run_json("show", "--db", db_url, results[0].key_hash[:8])
    assert entry["key"] == gemm_key("mm", 0)
    assert [t["candidate"] for t in entry["timings"]] == ["aten", "triton"]
    assert entry["best"] == "aten" and entry["token"] == 1 and entry["state"] == "done"
    human = run("show", "--db", db_url, results[0].key_hash[:8])
    assert human.stdout.splitlines()[0] == f"key_hash     {results[0].key_hash}"
    assert "           1  aten" in human.stdout

    missing = run("show", "--db", db_url, "ffffffff")
    assert missing.exit_code == 1
    assert missing.stderr == ("Error: ffffffff: no entry's key hash starts with it; "
                              "`tunecache ls` lists entries\n")
    bad = run("show", "--db", db_url, "xyz")
    assert bad.exit_code == 2
    assert bad.stderr == ("Error: KEY_HASH_PREFIX='xyz' is invalid: expected 4 to 64 hex "
                          "digits of a key hash\n")


def test_upgrade_creates_then_reports_head(tmp_path):
    db = str(tmp_path / "tune.db")  # in a directory that exists: upgrade never makes one
    first = run("upgrade", "--db", db)
    assert first.exit_code == 0
    assert first.stdout == (f"sqlite:///{db}: schema upgraded from revision (none) to "
                            f"{head_revision()}\n")
    again = run("upgrade", "--db", db)
    assert again.stdout == f"sqlite:///{db}: schema already at revision {head_revision()}\n"


def test_garbage_file_as_db(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    for command in ("stats", "ls", "prune --failed", "export"):
        result = run(*command.split(), "--db", str(garbage))
        assert result.exit_code == 1, command
        assert result.stderr == (f"Error: tunecache database sqlite:///{garbage}: file is not a "
                                 "database (`tunecache doctor` checks the setup)\n")


def test_unreachable_postgresql():
    result = run("stats", "--db", "postgresql://127.0.0.1:1/x")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "Error: tunecache database postgresql+psycopg://127.0.0.1:1/x: ")
    assert result.stderr.endswith("(`tunecache doctor` checks the setup)\n")
    assert result.stderr.count("\n") == 1


def test_missing_sqlite_file_and_bad_url(tmp_path):
    result = run("stats", "--db", str(tmp_path / "nope.db"))
    assert result.exit_code == 1
    assert "no database file there" in result.stderr
    assert not (tmp_path / "nope.db").exists()
    bad = run("ls", "--db", "mysql://h/db")
    assert bad.exit_code == 2
    assert bad.stderr == ("Error: --db='mysql://h/db' is invalid: expected a sqlite:/// or "
                          "postgresql:// URL, not mysql://\n")


def test_every_command_has_help():
    for command in ("stats", "prune", "export", "import", "merge", "doctor", "ls", "show",
                    "upgrade", "warm"):
        result = run(command, "--help")
        assert result.exit_code == 0 and "--db" in result.stdout, command


def test_stats_as_a_subprocess(db_url):
    """Acceptance: the installed console script, as an operator runs it."""
    populate(db_url, [gemm_key("mm", i) for i in range(4)], hits=1)
    exe = Path(sys.executable).with_name("tunecache")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["TUNECACHE_DB"] = db_url
    done = subprocess.run([str(exe), "stats", "--json"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["entries"]["by_state"]["done"] == 4 and data["hits"] == 4


def _triton_key(name: str, i: int) -> dict:
    return {"kind": "triton_config", "op": name,
            "env": {"device": "cuda cc=90 sms=132", "torch": "2.13.0", "triton": "3.6.0"},
            "kernel": f"k{i}"}


def test_stats_by_kind_and_a_bounded_by_op_table(db_url):
    populate(db_url, [gemm_key("mm", i) for i in range(3)])
    populate(db_url, [_triton_key(f"triton_poi_fused_{i}", i) for i in range(25)])
    data = run_json("stats", "--db", db_url)
    kinds = {r["kind"]: (r["entries"], r["done"]) for r in data["by_kind"]}
    assert kinds == {"triton_config": (25, 25), "gemm": (3, 3)}
    assert len(data["by_op"]) == 26  # --json lists every op

    human = run("stats", "--db", db_url).stdout.splitlines()
    by_kind = human.index("by kind:")
    assert human[by_kind + 2].split()[:3] == ["triton_config", "25", "25"]
    assert human[by_kind + 3].split()[:3] == ["gemm", "3", "3"]
    assert human[-1] == "  ... and 6 more ops (--json lists all)"


def test_ls_and_prune_select_by_kind(db_url):
    populate(db_url, [gemm_key("mm", i) for i in range(2)])
    populate(db_url, [_triton_key("triton_poi_fused_add", i) for i in range(3)])
    listed = run_json("ls", "--db", db_url, "--kind", "triton_config")
    assert sorted(r["kind"] for r in listed) == ["triton_config"] * 3
    dry = run_json("prune", "--db", db_url, "--kind", "triton_config", "--dry-run")
    assert dry["would_delete"] == 3
    assert run_json("prune", "--db", db_url, "--kind", "triton_config")["deleted"] == 3
    assert sorted(r["kind"] for r in run_json("ls", "--db", db_url)) == ["gemm", "gemm"]


def test_stats_says_what_each_hit_count_counts(db_url):
    """The entries' counters lose a pruned entry's hits, the processes' reports keep them:
    both are shown, each saying what it counts (it read "hits 6 on entries" beside
    "usage 2 flushes: 8 hits", with nothing to tell why they differ)."""
    populate(db_url, [gemm_key("mm", i) for i in range(3)], hits=2)
    populate(db_url, [gemm_key("bmm", 0, torch="2.12.0")], hits=2)
    assert run_json("prune", "--db", db_url, "--torch", "2.12.0")["deleted"] == 1
    data = run_json("stats", "--db", db_url)
    assert (data["hits"], data["usage"]["hits"], data["usage"]["reports"]) == (6, 8, 2)
    lines = run("stats", "--db", db_url).stdout.splitlines()
    assert lines[5].startswith("hits      6 results served by the stored entries (cache hits "
                               "and peers' results); tuning stored ")
    assert lines[6].startswith("processes 2 reports: 8 cache hits, 0 peers' results, 4 tuned, "
                               "0 tuned without the database; compile time avoided ")


def test_ls_marks_a_cut_winner_with_an_ellipsis_and_survives_garbage_columns(sqlite_url):
    from sqlalchemy import create_engine

    import tunecache
    from tunecache.settings import resolve_db_url

    long_name = "triton_mm_" + "x" * 60
    with tunecache.open(sqlite_url) as cache:
        cache.get_or_tune(gemm_key("mm", 0), lambda: {long_name: 0.5, "aten": 1.0})
        odd = cache.get_or_tune(gemm_key("mm", 1), lambda: {"aten": 1.0})  # garbled below
    # SQLite keeps whatever a writer puts in a column: text where a number belongs.
    engine = create_engine(resolve_db_url(sqlite_url))
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE tunecache_entries SET tune_seconds = 'slow', "
                             "last_used_at = 'x' WHERE key_hash = ?", (odd.key_hash,))
    engine.dispose()
    result = run("ls", "--db", sqlite_url)
    assert result.exit_code == 0
    assert f" {long_name[:39]}\u2026 " in result.stdout
    assert long_name[:40] not in result.stdout
    [odd_line] = [line for line in result.stdout.splitlines()
                  if line.startswith(odd.key_hash[:12])]
    assert odd_line.split()[5:7] == ["aten", "?"]


def test_stats_bounds_stored_text_in_sql_so_an_oversized_op_or_error_never_leaves_it(db_url):
    from test_cli_hostile_rows import _set_entries

    from tunecache.keys import key_hash

    fail_key(db_url, gemm_key("addmm", 9))
    sqlite = db_url.startswith("sqlite")  # PostgreSQL's varchar(256) refuses a long op
    _set_entries(db_url, key_hash(gemm_key("addmm", 9))[0], error="e" * 100_000,
                 **({"op": "x" * 100_000} if sqlite else {}))
    for args in ((), ("--json",)):
        assert run("stats", "--db", db_url, *args).exit_code == 0
    data = run_json("stats", "--db", db_url)
    [failed] = data["failed"]["keys"]
    op = None if sqlite else "addmm"
    assert (failed["op"], failed["error"]) == (op, None)
    assert [r["op"] for r in data["by_op"]] == [op]
