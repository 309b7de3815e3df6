"""Garbage in import files and in database columns is an invalid entry, never a traceback.

Deeply nested JSON is the sharpest case: json's C scanner recurses once per level and
raises RecursionError (not ValueError) long before any size limit is reached.
"""

from __future__ import annotations

import json

from cli_helpers import gemm_key, populate, run, run_json
from sqlalchemy import create_engine, text, update

from tunecache.keys import key_hash
from tunecache.settings import resolve_db_url
from tunecache.store.schema import entries

HEADER = json.dumps({"format": "tunecache-export", "version": 1})
# A line nested deeper than json's recursion allows: 200 KB, under the 1 MiB timings
# limit and the line limit.
DEEP_LINE = '{"key":{"a":' + "[" * 100_000 + "]" * 100_000 + '},"timings":{"x":1}}'
# Under MAX_KEY_BYTES (64 KiB), so only its depth is wrong.
DEEP_OBJECT = '{"a":' + "[" * 20_000 + "]" * 20_000 + "}"


def _line(key, timings):
    return json.dumps({"key": key, "timings": timings, "tune_seconds": 1.0})


def test_a_deeply_nested_import_line_is_invalid_and_the_lines_around_it_import(db_url,
                                                                               tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("\n".join([HEADER, _line(gemm_key("mm", 1), {"aten": 1.0}), DEEP_LINE,
                               _line(gemm_key("mm", 2), {"aten": 2.0})]) + "\n")
    result = run("import", str(path), "--db", db_url)
    assert result.exit_code == 1
    assert "2 new, 0 replaced, 0 kept, 0 busy (being tuned), 1 invalid" in result.stdout
    assert result.stderr.splitlines()[0] == f"{path}: line 3: not JSON (nested too deeply)"
    assert sorted(r["key_hash"] for r in run_json("ls", "--db", db_url)) == sorted(
        key_hash(gemm_key("mm", i))[0] for i in (1, 2))


def _corrupt(url, h, **values):
    engine = create_engine(resolve_db_url(url))
    with engine.begin() as conn:
        conn.execute(update(entries).where(entries.c.key_hash == h).values(**values))
    engine.dispose()


def test_rows_with_deeply_nested_columns_are_shown_skipped_and_pruned(db_url, tmp_path):
    good, deep_key, deep_timings = populate(db_url, [gemm_key("mm", i) for i in range(3)])
    _corrupt(db_url, deep_key.key_hash, key_json=DEEP_OBJECT)
    _corrupt(db_url, deep_timings.key_hash, timings_json=DEEP_OBJECT)

    assert len(run_json("ls", "--db", db_url)) == 3
    shown = run("show", "--db", db_url, deep_key.key_hash)
    assert shown.exit_code == 0
    assert "key: INVALID (key is nested too deeply)" in shown.stdout
    shown = run_json("show", "--db", db_url, deep_timings.key_hash)
    assert shown["timings_error"] == "timings are nested too deeply"

    exported = run("export", "--db", db_url)
    assert exported.exit_code == 0
    assert [json.loads(line)["key_hash"] for line in exported.stdout.splitlines()[1:]] == [
        good.key_hash]
    assert exported.stderr.splitlines()[0] == "exported 1 entry; skipped 2 invalid"

    target = f"sqlite:///{tmp_path / 'target.db'}"
    merged = run("merge", db_url, "--into", target, "--json")
    assert merged.exit_code == 1
    data = json.loads(merged.stdout)
    assert (data["new"], data["invalid"]) == (1, 2)
    assert sorted(b["reason"] for b in data["bad"]) == [
        "key is nested too deeply", "timings are nested too deeply"]

    dry = run_json("prune", "--db", db_url, "--invalid", "--dry-run")
    assert sorted(e["key_hash"] for e in dry["entries"]) == sorted(
        [deep_key.key_hash, deep_timings.key_hash])
    assert run_json("prune", "--db", db_url, "--invalid")["deleted"] == 2
    assert [r["key_hash"] for r in run_json("ls", "--db", db_url)] == [good.key_hash]


def test_a_stored_key_that_is_not_an_object_is_invalid(sqlite_url):
    """Columns are untrusted too: a key column holding a JSON list is reported, exported
    by nobody, and pruned by --invalid."""
    _good, bad = populate(sqlite_url, [gemm_key("mm", 0), gemm_key("mm", 1)])
    _corrupt(sqlite_url, bad.key_hash, key_json="[1, 2]")
    dry = run_json("prune", "--db", sqlite_url, "--invalid", "--dry-run")
    assert [(e["key_hash"], e["invalid"]) for e in dry["entries"]] == [
        (bad.key_hash, "key is not a JSON object")]
    assert run("export", "--db", sqlite_url).stderr.splitlines()[1] == (
        f"  skipped {bad.key_hash[:16]}: key is not a JSON object")


def test_a_claim_with_an_absurd_lease_counts_as_expired_for_stats_prune_and_import(
        db_url, tmp_path):
    """A lease that ends in 1e300 is nobody's claim (claims.lease_passed): stats counts it
    expired, prune --expired-claims deletes it, and import replaces it instead of calling
    it busy."""
    from cli_helpers import claim_key

    for i in (1, 2):
        claim_key(db_url, gemm_key("mm", i), lease_seconds=600)
        _corrupt(db_url, key_hash(gemm_key("mm", i))[0], lease_expires_at=1e300)
    claims = run_json("stats", "--db", db_url)["claims"]
    assert (claims["in_flight"], claims["expired"], claims["live"]) == (0, 2, [])
    shown = run("show", "--db", db_url, key_hash(gemm_key("mm", 1))[0])
    assert "lease        expired" in shown.stdout

    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([HEADER, _line(gemm_key("mm", 1), {"aten": 1.0})]) + "\n")
    imported = run("import", str(path), "--db", db_url, "--json")
    assert imported.exit_code == 0, imported.output
    assert (json.loads(imported.stdout)["replaced"], json.loads(imported.stdout)["busy"]) == (1, 0)

    assert run_json("prune", "--db", db_url, "--expired-claims")["deleted"] == 1
    assert [r["key_hash"] for r in run_json("ls", "--db", db_url)] == [
        key_hash(gemm_key("mm", 1))[0]]


def test_import_over_a_claim_whose_lease_is_text_replaces_it(sqlite_url, tmp_path):
    from cli_helpers import claim_key

    claim_key(sqlite_url, gemm_key("mm", 1), lease_seconds=600)
    engine = create_engine(resolve_db_url(sqlite_url))
    with engine.begin() as conn:  # text in the REAL column, as SQLite keeps it
        conn.execute(text("UPDATE tunecache_entries SET lease_expires_at = 'soon'"))
    engine.dispose()
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join([HEADER, _line(gemm_key("mm", 1), {"aten": 1.0})]) + "\n")
    imported = run("import", str(path), "--db", sqlite_url, "--json")
    assert imported.exit_code == 0, imported.output
    assert json.loads(imported.stdout)["replaced"] == 1
