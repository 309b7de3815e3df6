"""Hostile rows through the operator commands: text from the database never reaches a
terminal raw (a stored name cannot forge a table row or recolour it), and sizes read from
rows are validated before they are summed or budgeted."""

from __future__ import annotations

import json
import os

from cli_helpers import claim_key, fail_key, gemm_key, populate, run, run_json
from sqlalchemy import update

from tunecache.keys import key_hash
from tunecache.settings import resolve_db_url
from tunecache.store import ArtifactStore, Database, ensure_schema
from tunecache.store.schema import artifacts, entries

# ESC (C0), NEL (C1), DEL, a newline that would start a forged row, right-to-left
# override and isolate (bidi), the Unicode line separator.
HOSTILE = "x\x1b[31mred\x1b[0m\nforged  row\x85\x7f\u202e\u2066\u2028!"
RAW = set("\x1b\x85\x7f\u202e\u2066\u2028\r\x00")


def _db(url: str) -> Database:
    db = Database(resolve_db_url(url))
    ensure_schema(db)
    return db


def _set_entries(url: str, h: str, **values) -> None:
    db = _db(url)
    db.run(lambda c: c.execute(update(entries).where(entries.c.key_hash == h).values(**values)),
           write=True)
    db.dispose()


def _assert_clean(output: str) -> None:
    """No control character reached the output raw, and no line starts with the forged
    row (a raw newline would have started one)."""
    assert not RAW & set(output), repr(output)
    for line in output.splitlines():
        assert not line.startswith("forged"), repr(output)


def test_ls_stats_and_show_escape_control_characters_from_the_database(db_url):
    done, claimed, failed = (gemm_key("mm", i) for i in range(3))
    populate(db_url, [done])
    claim_key(db_url, claimed, lease_seconds=600, owner=HOSTILE)
    fail_key(db_url, failed)
    for k in (done, claimed, failed):
        _set_entries(db_url, key_hash(k)[0], kind=HOSTILE, op=HOSTILE, device=HOSTILE,
                     torch_version=HOSTILE, triton_version=HOSTILE)
    _set_entries(db_url, key_hash(done)[0], best=HOSTILE)
    _set_entries(db_url, key_hash(failed)[0], error=HOSTILE)
    db = _db(db_url)
    store = ArtifactStore(db)
    assert store.put("fxgraph", "k" + HOSTILE, os.urandom(100), b"\x07" * 64, HOSTILE)
    db.run(lambda c: c.execute(update(artifacts).values(kind=HOSTILE)), write=True)
    db.dispose()

    for args in (["ls"], ["ls", "--graphs"], ["stats"], ["show", key_hash(done)[0]],
                 ["show", key_hash(claimed)[0]], ["show", key_hash(failed)[0]],
                 ["prune", "--failed", "--dry-run"]):
        result = run(*args, "--db", db_url)
        assert result.exit_code == 0, result.output
        _assert_clean(result.stdout)
        assert "x\\x1b[31mred\\x1b[0m\\x0aforged  row\\x85\\x7f\\u202e\\u2066\\u2028!" \
            in result.stdout or "\u2026" in result.stdout, (args, result.stdout)

    # --json stays JSON, with the stored text exactly as stored.
    rows = run_json("ls", "--db", db_url)
    assert {r["op"] for r in rows} == {HOSTILE}
    assert {r["kind"] for r in run_json("ls", "--graphs", "--db", db_url)} == {HOSTILE}
    assert run_json("stats", "--db", db_url)["claims"]["live"][0]["owner"] == HOSTILE


def _graphs(url: str, *sizes: int) -> None:
    """Publish one 1000-byte graph per entry of ``sizes``, then set its row's size."""
    db = _db(url)
    store = ArtifactStore(db)
    for i, size in enumerate(sizes):
        assert store.put("fxgraph", f"g{i}", os.urandom(1000), b"\x07" * 64, "2.13.0")
        statement = (update(artifacts).where(artifacts.c.cache_key == f"g{i}")
                     .values(size=size, last_used_at=1e9 + i))
        db.run(lambda c, s=statement: c.execute(s), write=True)
    db.dispose()


BAD_SIZES = [-10**18, 2**63 - 1, -1]


def test_stats_counts_rows_with_an_impossible_size_as_invalid_and_sums_the_rest(db_url):
    _graphs(db_url, 1000, 1000, *BAD_SIZES)
    for _ in range(2):  # and again: nothing it did left the database unreadable
        graphs = run_json("stats", "--db", db_url)["graphs"]
        assert (graphs["count"], graphs["bytes"], graphs["invalid"]) == (5, 2000, 3)
        human = run("stats", "--db", db_url)
        assert human.exit_code == 0, human.output
        assert "5 compiled graphs, 2.0 KiB" in human.stdout
        assert "3 with an invalid size" in human.stdout
    listed = {r["key"]: r["size"] for r in run_json("ls", "--graphs", "--db", db_url)}
    assert listed == {"g0": 1000, "g1": 1000, "g2": None, "g3": None, "g4": None}


def test_prune_by_graph_bytes_removes_rows_with_an_impossible_size_first(db_url):
    # The most recently used row claims -10^18 bytes: summed, it left room for everything.
    _graphs(db_url, 1000, 1000, 1000, *BAD_SIZES[::-1])
    report = run_json("prune", "--db", db_url, "--max-graph-bytes", "2000B")["graphs"]
    assert (report["deleted"], report["over_budget"]) == (4, 4)
    assert sorted(r["key"] for r in run_json("ls", "--graphs", "--db", db_url)) == ["g1", "g2"]


def _import_line(key, timings) -> str:
    # json.dumps writes a lone surrogate and NUL as \ud800 and \u0000 escapes, which
    # json.loads reads back as those characters: what a hostile export file holds.
    return json.dumps({"key": key, "timings": timings, "tune_seconds": 1.0})


def test_import_reports_and_skips_lines_with_nul_or_lone_surrogates_and_keeps_the_rest(
        db_url, tmp_path):
    good = [gemm_key("mm", i) for i in range(3)]
    lines = [
        json.dumps({"format": "tunecache-export", "version": 1}),
        _import_line(good[0], {"aten": 1.0}),
        _import_line(gemm_key("mm", 10), {"aten\ud800": 1.0}),  # line 3
        _import_line(gemm_key("mm\x00", 11), {"aten": 1.0}),  # line 4: NUL in a label
        _import_line({**gemm_key("mm", 12), "extra": "a\x00b"}, {"aten": 1.0}),  # 5: in the key
        _import_line(gemm_key("mm", 13), {"at\x00en": 1.0}),  # line 6
        _import_line(gemm_key("mm\ud800", 14), {"aten": 1.0}),  # line 7
        _import_line(good[1], {"aten": 2.0}),
        _import_line({**gemm_key("mm", 15), "note": "a\\u0000b"}, {"aten": 1.0}),  # 9: no NUL
        _import_line(good[2], {"aten": 3.0}),
    ]
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run("import", str(path), "--db", db_url)
    assert result.exit_code == 1, result.output
    assert "4 new, 0 replaced, 0 kept, 0 busy (being tuned), 5 invalid" in result.stdout
    reported = [line.split(": ", 2)[:2] for line in result.stderr.splitlines()[:5]]
    assert reported == [[str(path), f"line {n}"] for n in (3, 4, 5, 6, 7)]
    stored = sorted(r["key_hash"] for r in run_json("ls", "--db", db_url))
    assert stored == sorted(key_hash(k)[0] for k in [*good, {**gemm_key("mm", 15),
                                                            "note": "a\\u0000b"}])


def test_keys_and_timings_with_nul_or_lone_surrogates_are_refused_at_validation():
    import pytest

    from tunecache.errors import InvalidEntryError
    from tunecache.keys import Key, validate_timings

    for bad in ({"op": "mm\x00"}, {"env": {"torch": "2.13\x00"}}, {"a": ["x\x00"]},
                {"op": "mm\udc80"}, {"k\x00": 1}):
        with pytest.raises(ValueError):
            Key.of(bad)
    assert Key.of({"a": "\\u0000"}).mapping == {"a": "\\u0000"}  # text, not a NUL
    for name in ("a\x00", "\ud800"):
        with pytest.raises(InvalidEntryError):
            validate_timings({name: 1.0})


def test_import_skips_graph_lines_with_nul_or_lone_surrogates_and_keeps_the_rest(
        db_url, tmp_path):
    import base64

    def graph(key: str, torch: str = "2.13.0") -> str:
        return json.dumps({"graph": {
            "kind": "fxgraph", "key": key, "torch": torch,
            "signature": base64.b64encode(b"\x07" * 64).decode(),
            "payload": base64.b64encode(os.urandom(100)).decode()}})

    lines = [json.dumps({"format": "tunecache-export", "version": 2}), graph("a"),
             graph("b\x00"), graph("c", torch="2.13\x00"), graph("d\udc80"), graph("e")]
    path = tmp_path / "graphs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run("import", str(path), "--db", db_url)
    assert result.exit_code == 1, result.output
    assert [line.split(": ", 2)[1] for line in result.stderr.splitlines()[:3]] == [
        "line 3", "line 4", "line 5"]
    assert sorted(r["key"] for r in run_json("ls", "--graphs", "--db", db_url)) == ["a", "e"]


def test_stats_survives_load_counts_no_job_could_have_recorded(db_url):
    # SQLite stores any integer a writer gives it: two counts near 2^63 overflowed its sum
    # and `stats` failed for good. PostgreSQL's column is 32-bit, so there the largest it
    # holds stands in.
    huge = 2**63 - 1 if db_url.startswith("sqlite") else 2**31 - 1
    _graphs(db_url, 1000, 1000, 1000, 1000)
    db = _db(db_url)
    for key, hits in (("g0", 5), ("g1", huge), ("g2", huge), ("g3", -7)):
        statement = update(artifacts).where(artifacts.c.cache_key == key).values(hits=hits)
        db.run(lambda c, s=statement: c.execute(s), write=True)
    db.dispose()
    for _ in range(2):
        result = run("stats", "--db", db_url)
        assert result.exit_code == 0, result.output
    graphs = run_json("stats", "--db", db_url)["graphs"]
    assert graphs["count"] == 4
    assert graphs["hits"] == (5 if db_url.startswith("sqlite") else 5 + 2 * huge)


def test_text_that_is_not_utf8_does_not_stop_the_operator_commands(sqlite_url):
    # SQLite stores whatever bytes a writer casts to text; decoding them strictly made
    # `stats`, `ls` and `prune` stop at the one row that a prune should remove.
    key = gemm_key("mm", 0)
    populate(sqlite_url, [key, gemm_key("mm", 1)])
    db = _db(sqlite_url)
    db.run(lambda c: c.exec_driver_sql(
        "UPDATE tunecache_entries SET triton_version = CAST(x'fffe41' AS TEXT), "
        "best = CAST(x'c3' AS TEXT) WHERE key_hash = ?", (key_hash(key)[0],)), write=True)
    db.dispose()
    for args in (["stats"], ["ls"], ["prune", "--invalid", "--dry-run"]):
        result = run(*args, "--db", sqlite_url)
        assert result.exit_code == 0, (args, result.output)
        _assert_clean(result.stdout)
    assert {r["triton"] for r in run_json("ls", "--db", sqlite_url)} >= {"\ufffd\ufffdA"}
    assert run_json("prune", "--db", sqlite_url, "--older-than", "0s")["deleted"] == 2
    assert run_json("ls", "--db", sqlite_url) == []


def test_warm_escapes_the_recorded_keys_it_skips_and_lists(db_url):
    env = {"device": "Old CPU", "device_type": "cpu", "torch": "2.12.0+cpu", "triton": "none"}
    inputs = "[('cpu', 'torch.float32', 2, 16, 24, 384, 24, 1, 0), " \
             "('cpu', 'torch.float32', 2, 24, 8, 192, 8, 1, 0)]"
    populate(db_url, [{"kind": "gemm", "op": HOSTILE, "inputs": inputs, "env": env},
                      {"kind": "gemm", "op": "bmm", "inputs": inputs + HOSTILE, "env": env},
                      {"kind": "gemm", "op": "bmm", "inputs": inputs, "precision": HOSTILE,
                       "env": env}])
    result = run("warm", "--dry-run", "--db", db_url)
    assert result.exit_code == 0, result.output
    _assert_clean(result.stdout)
    _assert_clean(result.stderr)
    assert "\\x1b[31m" in result.stderr
