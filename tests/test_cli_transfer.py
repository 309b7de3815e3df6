"""tunecache export / import / merge: format, validation, conflict policies."""

from __future__ import annotations

import json
import os

import pytest
from cli_helpers import claim_key, fail_key, gemm_key, populate, run, run_json

import tunecache


def _export(url, *args):
    result = run("export", "--db", url, *args)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]], result


def test_export_format_and_best_only(db_url, tmp_path):
    results = populate(db_url, [gemm_key("mm", i) for i in range(3)])
    fail_key(db_url, gemm_key("mm", 9))  # not done: never exported
    header, lines, result = _export(db_url)
    assert {k: header[k] for k in ("format", "version", "entries", "best_only")} == {
        "format": "tunecache-export", "version": 1, "entries": 3, "best_only": False}
    assert result.stderr == "exported 3 entries\n"
    assert sorted(line["key_hash"] for line in lines) == sorted(r.key_hash for r in results)
    first = next(line for line in lines if line["key"] == gemm_key("mm", 1))
    assert first["timings"] == {"aten": 1.25, "triton": 2.0} and first["best"] == "aten"

    _, best, _ = _export(db_url, "--best-only", "--op", "mm")
    assert all(line["timings"]["triton"] is None for line in best)

    out = tmp_path / "cache.jsonl"
    summary = run("export", "--db", db_url, "-o", str(out), "--json")
    assert json.loads(summary.stdout)["exported"] == 3
    assert len(out.read_text().splitlines()) == 4


def test_round_trip_into_an_empty_database(db_url, tmp_path):
    populate(db_url, [gemm_key("bmm", i) for i in range(5)])
    path = tmp_path / "x.jsonl"
    run("export", "--db", db_url, "-o", str(path))
    target = f"sqlite:///{tmp_path / 'target.db'}"
    result = run("import", str(path), "--db", target)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (f"imported into {target}: 5 new, 0 replaced, 0 kept, 0 busy "
                             "(being tuned), 0 invalid (on conflict: keep)\n")
    with tunecache.open(target) as cache:
        hit = cache.lookup(gemm_key("bmm", 2))
    assert hit is not None and hit.timings == {"aten": 1.5, "triton": 2.0}


def _entry(key, timings, **extra):
    return json.dumps({"key": key, "timings": timings, "tune_seconds": 1.0, **extra})


HEADER = json.dumps({"format": "tunecache-export", "version": 1})


def test_import_reports_bad_lines_and_keeps_good_ones(db_url, tmp_path):
    good = gemm_key("mm", 1)
    lines = [
        HEADER,
        _entry(good, {"aten": 0.5, "triton": None}),
        "{not json",
        json.dumps(["a", "list"]),
        _entry("not-an-object", {"aten": 1}),
        _entry(gemm_key("mm", 2), {"aten": -1.0}),
        _entry(gemm_key("mm", 3), {"aten": None}),  # valid: "nothing runs here" is a result
        _entry(gemm_key("mm", 4), {"aten": 1.0}, key_hash="0" * 64),
        _entry(gemm_key("mm", 5), {}),
        json.dumps({"key": gemm_key("mm", 6), "timings": {"aten": 1}, "tune_seconds": "slow"}),
        json.dumps({"key": {"big": "x" * 70000}, "timings": {"aten": 1}}),
        "",
    ]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = run("import", str(path), "--db", db_url)
    assert result.exit_code == 1
    assert "2 new, 0 replaced, 0 kept, 0 busy (being tuned), 8 invalid" in result.stdout
    errors = result.stderr.splitlines()
    assert errors[:8] == [
        f"{path}: line 3: not JSON (Expecting property name enclosed in double quotes at column 2)",
        f"{path}: line 4: not a JSON object",
        f"{path}: line 5: \"key\" is missing or not a JSON object",
        f"{path}: line 6: timing of 'aten' is -1.0",
        f"{path}: line 8: \"key_hash\" does not match the key (the key hashes to "
        f"{tunecache.keys.key_hash(gemm_key('mm', 4))[0][:16]})",
        f"{path}: line 9: timings are empty",
        f"{path}: line 10: \"tune_seconds\" is 'slow', not a non-negative number",
        f"{path}: line 11: bad key: a tunecache key must be under 65536 bytes as JSON",
    ]
    assert errors[8].startswith("Error: 8 invalid entries skipped")
    assert [r["key"] for r in [run_json("show", "--db", db_url,
                                        tunecache.keys.key_hash(good)[0])]] == [good]
    again = run("import", str(path), "--db", db_url, "--skip-invalid", "--json")
    assert again.exit_code == 0
    data = json.loads(again.stdout)
    assert (data["kept"], data["invalid"]) == (2, 8)
    assert data["bad"][0] == {"where": "line 3", "reason": "not JSON (Expecting property name "
                              "enclosed in double quotes at column 2)"}


def test_import_refuses_a_file_without_header(db_url, tmp_path):
    path = tmp_path / "garbage.jsonl"
    path.write_text("hello\nworld\n")
    result = run("import", str(path), "--db", db_url)
    assert result.exit_code == 1
    assert result.stderr == (f"Error: {path}: line 1 is not a tunecache export header; expected "
                             "a file written by `tunecache export` (first line {\"format\": "
                             "\"tunecache-export\", \"version\": 1, ...})\n")
    path.write_text(json.dumps({"format": "tunecache-export", "version": 99}) + "\n")
    result = run("import", str(path), "--db", db_url)
    assert result.exit_code == 1 and "version 99 is not supported" in result.stderr
    for empty in ("", "\n  \n"):  # no line to point at: the file says nothing
        path.write_text(empty)
        result = run("import", str(path), "--db", db_url)
        assert result.exit_code == 1
        assert result.stderr.startswith(f"Error: {path}: the file is empty, not a tunecache "
                                        "export; expected"), result.stderr


def test_conflict_policies(db_url, tmp_path):
    key = gemm_key("mm", 0)  # stored: aten 1.0, triton 2.0
    populate(db_url, [key])
    fail_key(db_url, gemm_key("mm", 1))
    claim_key(db_url, gemm_key("mm", 2), lease_seconds=600)
    claim_key(db_url, gemm_key("mm", 3), lease_seconds=0.01)

    def write(timings):
        path = tmp_path / f"in-{timings['aten']}.jsonl"
        path.write_text("\n".join([HEADER, _entry(key, timings)] + [
            _entry(gemm_key("mm", i), {"aten": 3.0}) for i in (1, 2, 3)]) + "\n")
        return str(path)

    def stored():
        return {t["candidate"]: t["ms"] for t in run_json(
            "show", "--db", db_url, tunecache.keys.key_hash(key)[0])["timings"]}

    slower = write({"aten": 1.5, "triton": 0.0 + 1.8})
    out = run_json("import", slower, "--db", db_url)  # keep (default)
    # failed key and expired claim replaced; live claim left alone; done entry kept
    assert (out["new"], out["replaced"], out["kept"], out["busy"]) == (0, 2, 1, 1)
    assert stored() == {"aten": 1.0, "triton": 2.0}
    assert run_json("import", slower, "--db", db_url, "--on-conflict", "faster")["kept"] == 3
    assert stored() == {"aten": 1.0, "triton": 2.0}
    faster = write({"aten": 0.5, "triton": 2.0})
    dry = run_json("import", faster, "--db", db_url, "--on-conflict", "faster", "--dry-run")
    assert dry["replaced"] == 1 and stored() == {"aten": 1.0, "triton": 2.0}
    assert run_json("import", faster, "--db", db_url, "--on-conflict", "faster")["replaced"] == 1
    assert stored() == {"aten": 0.5, "triton": 2.0}
    assert run_json("import", slower, "--db", db_url, "--on-conflict", "replace")["replaced"] == 1
    assert stored() == {"aten": 1.5, "triton": 1.8}
    # the live claim survived every policy
    states = {r["key_hash"]: r["state"] for r in run_json("ls", "--db", db_url)}
    assert states[tunecache.keys.key_hash(gemm_key("mm", 2))[0]] == "claimed"

    bad = run("import", slower, "--db", db_url, "--on-conflict", "newest")
    assert bad.exit_code == 2
    assert bad.stderr == "Error: Invalid value for '--on-conflict': 'newest' is not one of " \
           "'keep', 'replace', 'faster' (see 'tunecache import --help')\n"


def test_merge(db_url, tmp_path):
    src = f"sqlite:///{tmp_path / 'src.db'}"
    populate(src, [gemm_key("mm", i) for i in range(4)])
    populate(db_url, [gemm_key("mm", 0), gemm_key("bmm", 0)])
    out = run_json("merge", src, "--into", db_url)
    assert (out["new"], out["kept"], out["invalid"]) == (3, 1, 0)
    assert out["source"] == src
    assert len(run_json("ls", "--db", db_url)) == 5
    same = run("merge", src, "--db", src)
    assert same.exit_code == 2 and "a database other than the target" in same.stderr
    missing = run("merge", str(tmp_path / "nope.db"), "--into", db_url)
    assert missing.exit_code == 2 and "no such database file" in missing.stderr


def test_import_and_merge_create_a_database_file_but_never_its_directory(sqlite_url,
                                                                          tmp_path):
    """A mistyped directory is an error, as `stats` reports it, not a new tree of
    directories that quietly receives the import."""
    populate(sqlite_url, [gemm_key("mm", 0)])
    path = tmp_path / "x.jsonl"
    assert run("export", "--db", sqlite_url, "-o", str(path)).exit_code == 0
    missing = tmp_path / "typo" / "tune.db"
    for command in (["import", str(path), "--db", str(missing)],
                    ["merge", sqlite_url, "--into", str(missing)]):
        result = run(*command)
        assert result.exit_code == 1, command
        assert result.stderr == (f"Error: tunecache database sqlite:///{missing}: directory "
                                 f"{missing.parent} does not exist; check --db, or create it "
                                 "first (`tunecache doctor` checks the setup)\n")
    assert not missing.parent.exists()
    assert run("stats", "--db", str(missing)).exit_code == 1
    fresh = tmp_path / "fresh.db"  # in a directory that exists: created
    assert run_json("import", str(path), "--db", str(fresh))["new"] == 1


def test_best_only_export_keeps_every_candidate_so_consumers_get_a_full_hit(sqlite_url,
                                                                             tmp_path):
    """--best-only writes the losers' timings as null on purpose. Dropping them would look
    smaller, but a candidate missing from a stored entry is benchmarked as new
    (tunecache.inductor: "a stored entry tunes only the missing ones, under the derived
    key extra_candidates"), so a consumer of such a file would re-tune every loser of
    every GEMM. With nulls it reads a full hit and picks the same winner."""
    populate(sqlite_url, [gemm_key("mm", i) for i in range(3)])
    out = tmp_path / "best.jsonl"
    assert run("export", "--db", sqlite_url, "--best-only", "-o", str(out)).exit_code == 0
    target = tmp_path / "consumer.db"
    assert run_json("import", str(out), "--db", str(target))["new"] == 3
    with tunecache.open(str(target), mode="readonly") as consumer:
        hit = consumer.lookup(gemm_key("mm", 2))
    assert hit is not None and hit.best == "aten"
    assert hit.timings == {"aten": 1.5, "triton": float("inf")}


def test_export_to_a_missing_directory_is_a_one_line_error_and_writes_nothing(db_url, tmp_path):
    populate(db_url, [gemm_key("mm", 0)])
    target = tmp_path / "missing" / "out.jsonl"
    result = run("export", "--db", db_url, "-o", str(target))
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"Error: {target}: cannot write the export") and "No such file" in line
    assert result.stdout == ""
    assert not (tmp_path / "missing").exists()


# -- provenance: family and meta (migration 0006) ----------------------------------------

FAMILY = "f" * 64
META = {"transfer": {"from": ["a" * 64], "benchmarked": 2, "generated": 40},
        "baseline": {"candidate": "extern:aten", "ms": 3.0}, "best_ms": 1.0}


def _publish_with_provenance(url, key, family=FAMILY, meta=META):
    from tunecache.keys import Key

    with tunecache.open(url) as cache:
        claim = cache.claim(Key.of(key, family=family))
        assert cache.publish(claim, {"aten": 3.0, "triton": 1.0}, meta=meta) is not None


def _provenance(url, key):
    """(family, meta) of a stored entry, as its neighbours see them."""
    from tunecache.keys import Key

    with tunecache.open(url) as cache:
        meta = cache.lookup(key).meta
        probe = Key.of({**key, "inputs": "probe"}, family=FAMILY)
        family = FAMILY if any(n.key == key for n in cache.neighbours(probe)) else None
    return family, dict(meta)


def test_export_import_and_merge_keep_an_entrys_family_and_meta(db_url, tmp_path):
    key = gemm_key("mm", 1)
    _publish_with_provenance(db_url, key)
    _, lines, _ = _export(db_url)
    assert (lines[0]["family"], lines[0]["meta"]) == (FAMILY, META)
    path = tmp_path / "x.jsonl"
    run("export", "--db", db_url, "-o", str(path))

    imported = f"sqlite:///{tmp_path / 'imported.db'}"
    assert run_json("import", str(path), "--db", imported)["new"] == 1
    assert _provenance(imported, key) == (FAMILY, META)
    merged = f"sqlite:///{tmp_path / 'merged.db'}"
    assert run_json("merge", db_url, "--into", merged)["new"] == 1
    assert _provenance(merged, key) == (FAMILY, META)


def test_import_replace_overwrites_the_meta_with_the_incoming_entrys(db_url, tmp_path):
    key = gemm_key("mm", 1)
    _publish_with_provenance(db_url, key, meta={"regret": 2.0})
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join([HEADER, _entry(key, {"aten": 0.5}, meta=META,
                                              family=FAMILY)]) + "\n")
    assert run_json("import", str(path), "--db", db_url, "--on-conflict",
                    "replace")["replaced"] == 1
    assert _provenance(db_url, key) == (FAMILY, META)


def test_an_export_file_without_family_or_meta_still_imports(db_url, tmp_path):
    key = gemm_key("mm", 1)
    path = tmp_path / "old.jsonl"
    path.write_text("\n".join([HEADER, _entry(key, {"aten": 0.5})]) + "\n")
    assert run_json("import", str(path), "--db", db_url)["new"] == 1
    assert _provenance(db_url, key) == (None, {})


def test_import_refuses_an_entry_whose_family_or_meta_is_malformed(db_url, tmp_path):
    lines = [HEADER,
             _entry(gemm_key("mm", 0), {"aten": 1.0}, family="x" * 65),
             _entry(gemm_key("mm", 1), {"aten": 1.0}, family=7),
             _entry(gemm_key("mm", 2), {"aten": 1.0}, family="a\x00b"),
             _entry(gemm_key("mm", 3), {"aten": 1.0}, meta="fast"),
             _entry(gemm_key("mm", 4), {"aten": 1.0}, meta=[1]),
             _entry(gemm_key("mm", 5), {"aten": 1.0}, meta={"note": "x" * 70000}),
             _entry(gemm_key("mm", 6), {"aten": 1.0}, meta={"note": "\ud800"}),
             _entry(gemm_key("mm", 7), {"aten": 1.0}, meta=META, family=FAMILY)]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    data = json.loads(run("import", str(path), "--db", db_url, "--json").stdout)
    assert (data["new"], data["invalid"]) == (1, 7)
    reasons = [b["reason"] for b in data["bad"]]
    assert reasons[:3] == ['"family" is not a sha256 hex digest (64 characters 0-9, a-f)'] * 3
    assert reasons[3:5] == ['"meta" is not a JSON object'] * 2
    assert all(r.startswith('"meta" is not a JSON object tunecache stores') for r in reasons[5:])
    assert _provenance(db_url, gemm_key("mm", 7)) == (FAMILY, META)


def test_merge_and_export_drop_a_garbled_meta_or_family_but_keep_the_entry(sqlite_url,
                                                                           tmp_path):
    import sqlite3

    key = gemm_key("mm", 1)
    _publish_with_provenance(sqlite_url, key)
    with sqlite3.connect(sqlite_url[len("sqlite:///"):]) as conn:
        conn.execute("UPDATE tunecache_entries SET meta_json = '{not json', family = ?",
                     ("x" * 300,))
    _, lines, _ = _export(sqlite_url)
    assert "meta" not in lines[0] and "family" not in lines[0]
    merged = f"sqlite:///{tmp_path / 'merged.db'}"
    assert run_json("merge", sqlite_url, "--into", merged)["new"] == 1
    assert _provenance(merged, key) == (None, {})


def test_an_export_that_fails_leaves_no_partial_file_and_an_earlier_one_as_it_was(tmp_path):
    from tunecache.cli.exchanging import _output_file

    path = tmp_path / "cache.jsonl"
    path.write_text("the export of yesterday\n")
    with pytest.raises(KeyboardInterrupt), _output_file(str(path)) as f:
        f.write('{"format": "tunecache-export", "version": 1}\n{"key": ')
        raise KeyboardInterrupt  # Ctrl-C, or a database error, half-way
    assert path.read_text() == "the export of yesterday\n"
    assert [p.name for p in tmp_path.iterdir()] == ["cache.jsonl"]
    with _output_file(str(path)) as f:
        f.write("whole\n")
    assert path.read_text() == "whole\n"
    assert [p.name for p in tmp_path.iterdir()] == ["cache.jsonl"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~_current_umask()


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- hostile numbers, meta and families ---------------------------------------------------

BIG = "1" + "0" * 309  # a 310-digit integer: float() of it overflows


def _set_columns(url, key, **values):
    from sqlalchemy import create_engine, update

    from tunecache.settings import resolve_db_url
    from tunecache.store.schema import entries

    engine = create_engine(resolve_db_url(url))
    with engine.begin() as conn:
        conn.execute(update(entries).where(
            entries.c.key_hash == tunecache.keys.key_hash(key)[0]).values(**values))
    engine.dispose()


def test_a_310_digit_number_in_an_import_line_costs_only_that_line(db_url, tmp_path):
    raw = [HEADER, _entry(gemm_key("mm", 0), {"aten": 1.0}),
           _entry(gemm_key("mm", 1), {"aten": 1.0}).replace('"aten": 1.0', f'"aten": {BIG}'),
           _entry(gemm_key("mm", 2), {"aten": 1.0}).replace('"inputs": 2', f'"inputs": {BIG}'),
           _entry(gemm_key("mm", 3), {"aten": 1.0}).replace('"tune_seconds": 1.0',
                                                          f'"tune_seconds": {BIG}'),
           _entry(gemm_key("mm", 4), {"aten": 1.0}, created_at=0).replace(
               '"created_at": 0', f'"created_at": -{BIG}'),
           _entry(gemm_key("mm", 5), {"aten": 1.0})]
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(raw) + "\n")
    result = run("import", str(path), "--db", db_url)
    assert result.exit_code == 1
    assert "2 new, 0 replaced, 0 kept, 0 busy (being tuned), 4 invalid" in result.stdout
    number = f"out of range (number {BIG[:20]}\u2026)"
    assert result.stderr.splitlines()[:4] == [
        f"{path}: line {n}: not JSON ({number})" for n in (3, 4, 5)] + [
        f"{path}: line 6: not JSON (out of range (number -{BIG[:19]}\u2026))"]
    assert sorted(r["key_hash"] for r in run_json("ls", "--db", db_url)) == sorted(
        tunecache.keys.key_hash(gemm_key("mm", i))[0] for i in (0, 5))


def test_export_and_merge_skip_a_row_holding_a_310_digit_number_with_one_warning(db_url,
                                                                                tmp_path):
    keys = [gemm_key("mm", i) for i in range(4)]
    populate(db_url, keys)
    hashes = [tunecache.keys.key_hash(k)[0] for k in keys]
    _set_columns(db_url, keys[0], timings_json=f'{{"aten": {BIG}}}')
    _set_columns(db_url, keys[1], key_json=f'{{"inputs": {BIG}}}')
    _set_columns(db_url, keys[2], tune_seconds=float("inf"))  # what SQLite makes of it
    result = run("export", "--db", db_url)
    assert result.exit_code == 0, result.output
    number = f"out of range (number {BIG[:20]}\u2026)"
    why = sorted([(hashes[0], f"timings are {number}"),
                  (hashes[1], f"key is {number}"),
                  (hashes[2], '"tune_seconds" is inf, not a non-negative number')])
    assert result.stderr.splitlines() == ["exported 1 entry; skipped 3 invalid"] + [
        f"  skipped {h[:16]}: {reason}" for h, reason in why]
    assert [json.loads(line)["key_hash"] for line in result.stdout.splitlines()[1:]] == [
        hashes[3]]
    merged = f"sqlite:///{tmp_path / 'merged.db'}"
    out = run("merge", db_url, "--into", merged, "--skip-invalid")
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith(f"merged into {merged}: 1 new, 0 replaced, 0 kept, 0 busy "
                                 "(being tuned), 3 invalid")
    # Each line names the source (as the database shows it) and the entry.
    assert [line.split(": entry ", 1)[1] for line in out.stderr.splitlines()] == [
        f"{h[:16]}: {reason}" for h, reason in why]


def test_export_and_merge_keep_an_entry_whose_meta_holds_nan_without_its_meta_and_say_so(
        db_url, tmp_path):
    keys = [gemm_key("mm", i) for i in range(3)]
    for key in keys:
        _publish_with_provenance(db_url, key)
    _set_columns(db_url, keys[0], meta_json='{"regret": NaN}')
    _set_columns(db_url, keys[1], meta_json='{"regret": Infinity}', family="\x1b[31m")
    result = run("export", "--db", db_url)
    assert result.exit_code == 0, result.output
    assert result.stderr == ("exported 3 entries; 2 kept without their family or meta, "
                             "which could not be read\n")
    lines = {json.loads(line)["key"]["inputs"]: json.loads(line)
             for line in result.stdout.splitlines()[1:]}
    assert ("meta" in lines[0], "family" in lines[0]) == (False, True)
    assert ("meta" in lines[1], "family" in lines[1]) == (False, False)
    assert lines[2]["meta"] == META
    merged = f"sqlite:///{tmp_path / 'merged.db'}"
    out = run("merge", db_url, "--into", merged)
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[0].startswith(f"merged into {merged}: 3 new, 0 replaced")
    [line] = out.stderr.splitlines()
    assert line.endswith(": 2 entries kept without their family or meta, which could not be "
                         "read")
    assert json.loads(run("merge", db_url, "--into", merged, "--json").stdout)[
        "provenance_dropped"] == 2
    assert _provenance(merged, keys[0]) == (FAMILY, {})
    assert _provenance(merged, keys[2]) == (FAMILY, META)


def test_import_takes_only_a_sha256_hex_digest_as_a_family(db_url, tmp_path):
    lines = [HEADER,
             _entry(gemm_key("mm", 0), {"aten": 1.0}, family="\x1b[31m" + "f" * 56),
             _entry(gemm_key("mm", 1), {"aten": 1.0}, family="F" * 64),
             _entry(gemm_key("mm", 2), {"aten": 1.0}, family="f" * 63 + "\n"),
             _entry(gemm_key("mm", 3), {"aten": 1.0}, family=FAMILY)]
    path = tmp_path / "families.jsonl"
    path.write_text("\n".join(lines) + "\n")
    data = json.loads(run("import", str(path), "--db", db_url, "--json").stdout)
    assert (data["new"], data["invalid"]) == (1, 3)
    assert {b["reason"] for b in data["bad"]} == {
        '"family" is not a sha256 hex digest (64 characters 0-9, a-f)'}
    assert _provenance(db_url, gemm_key("mm", 3))[0] == FAMILY


def test_export_merge_and_import_queries_bound_every_text_column_they_read_in_sql():
    from sqlalchemy.dialects import postgresql, sqlite

    from tunecache.store import exchange_queries

    for statement in (exchange_queries.select_done_page(None, "", 10),
                      exchange_queries.read_for_import):
        for dialect, length in ((postgresql.dialect(), "octet_length"),
                                (sqlite.dialect(), "length")):
            sql = str(statement.compile(dialect=dialect))
            selected = sql[:sql.index("FROM ")]
            for name in ("key_json", "timings_json", "family", "meta_json", "state"):
                if f"tunecache_entries.{name}" in selected:
                    assert f"{length}(tunecache_entries.{name}) <=" in selected, (name, sql)


# -- a file cut short, Ctrl-C ------------------------------------------------------------


def test_an_export_file_cut_short_is_imported_as_far_as_it_goes_and_said_with_exit_1(
        db_url, tmp_path):
    header = json.dumps({"format": "tunecache-export", "version": 1, "entries": 5,
                         "graphs": 0})
    path = tmp_path / "cut.jsonl"
    path.write_text("\n".join([header] + [_entry(gemm_key("mm", i), {"aten": 1.0})
                                          for i in range(3)]) + "\n")
    result = run("import", str(path), "--db", db_url, "--skip-invalid")
    assert result.exit_code == 1
    assert ": 3 new, 0 replaced, 0 kept, 0 busy (being tuned), 0 invalid" in result.stdout
    assert result.stderr == (f"Error: {path}: the file ends after 3 of the 5 lines its header "
                             "counts: it was cut short (the 3 present were imported); import "
                             "a whole copy for the rest\n")
    assert len(run_json("ls", "--db", db_url)) == 3
    whole = tmp_path / "whole.jsonl"
    whole.write_text(path.read_text().replace('"entries": 5', '"entries": 3'))
    assert run("import", str(whole), "--db", db_url).exit_code == 0


def _rows(url):
    from sqlalchemy import create_engine, exc, func, select

    from tunecache.settings import resolve_db_url
    from tunecache.store.schema import entries

    if url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///"):]):
        return 0  # connecting would create the file the import is about to create
    engine = create_engine(resolve_db_url(url))
    try:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(entries)).scalar_one()
    except exc.DBAPIError:  # the import has not created the table yet
        return 0
    finally:
        engine.dispose()


@pytest.mark.timeout(300)
def test_ctrl_c_during_an_import_says_what_is_committed_up_to_where_and_exits_130(db_url,
                                                                                 tmp_path):
    """A real import reading its file from a pipe: the test feeds 700 lines, waits until
    the first batch of 500 is in the database, sends SIGINT, then feeds the lines that
    complete the second batch. The import stops once everything it read is committed:
    after the first batch, or the second if it had read on (which one depends on where
    the signal finds it, so both are taken); it says which, that is what the database
    holds, it exits 130, and the same import again finishes it."""
    import re
    import signal
    import subprocess
    import sys

    import procs

    lines = [HEADER] + [_entry(gemm_key("mm", i), {"aten": 1.0}) for i in range(1010)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunecache.cli", "import", "-", "--db", db_url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.stdin.write("\n".join(lines[:701]) + "\n")  # the header and 700 entries
        proc.stdin.flush()
        procs.wait_until(lambda: _rows(db_url) >= 500 or proc.poll() is not None,
                         "the first batch committed")
        proc.send_signal(signal.SIGINT)
        try:
            proc.stdin.write("\n".join(lines[701:]) + "\n")  # the second batch, and 9 more
            proc.stdin.flush()
        except BrokenPipeError:  # it had stopped after the first batch
            pass
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (stdout, stderr)
    match = re.fullmatch(
        r"interrupted by Ctrl-C: imported <stdin> up to line (\d+), all committed \((\d+) new, "
        r"0 replaced, 0 kept, 0 busy \(being tuned\), 0 invalid\); the rest is not; run the "
        r"same command again to finish \(what is in already stays as it is\)\n", stdout)
    assert match, stdout
    line, new = int(match.group(1)), int(match.group(2))
    assert (line, new) in ((501, 500), (1001, 1000))
    assert _rows(db_url) == new
    again = run("import", "-", "--db", db_url, input="\n".join(lines) + "\n")
    assert again.exit_code == 0, again.output
    assert f": {1010 - new} new, 0 replaced, {new} kept, 0 busy (being tuned), 0 invalid" \
        in again.stdout


@pytest.mark.timeout(300)
def test_ctrl_c_during_a_merge_says_up_to_which_entry_it_is_committed_and_exits_130(pg_url,
                                                                                   tmp_path):
    """A real merge into PostgreSQL, whose second batch waits on a row the test holds
    uncommitted: SIGINT once the first batch is in, then the row let go. The merge stops
    once everything it read is committed (after the first batch or the second, wherever
    the signal finds it), says up to which source entry, and exits 130."""
    import re
    import signal
    import subprocess
    import sys

    import procs
    from sqlalchemy import create_engine, insert

    from tunecache.settings import resolve_db_url
    from tunecache.store import Database, ensure_schema
    from tunecache.store.schema import entries

    src = f"sqlite:///{tmp_path / 'src.db'}"
    keys = [gemm_key("mm", i) for i in range(1100)]
    populate(src, keys)
    hashes = sorted(tunecache.keys.key_hash(k)[0] for k in keys)
    target = Database(resolve_db_url(pg_url))
    ensure_schema(target)
    target.dispose()
    engine = create_engine(resolve_db_url(pg_url))
    holder = engine.connect()
    held = holder.begin()
    holder.execute(insert(entries).values(
        key_hash=hashes[700], key_json="{}", state="claimed", token=1, attempts=1,
        created_at=0.0, updated_at=0.0, hits=0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunecache.cli", "merge", src, "--into", pg_url],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        procs.wait_until(lambda: _rows(pg_url) >= 500 or proc.poll() is not None,
                         "the first batch committed")
        proc.send_signal(signal.SIGINT)
        held.rollback()
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        holder.close()
        engine.dispose()
    assert proc.returncode == 130, (stdout, stderr)
    match = re.fullmatch(
        rf"interrupted by Ctrl-C: merged {re.escape(src)} up to entry ([0-9a-f]{{16}}), all "
        r"committed \((\d+) new, 0 replaced, 0 kept, 0 busy \(being tuned\), 0 invalid\); the "
        r"rest is not; run the same command again to finish \(what is in already stays as it "
        r"is\)\n", stdout)
    assert match, stdout
    through, new = match.group(1), int(match.group(2))
    assert (through, new) in ((hashes[499][:16], 500), (hashes[999][:16], 1000))
    assert _rows(pg_url) == new
    again = run_json("merge", src, "--into", pg_url)
    assert (again["new"], again["kept"]) == (1100 - new, new)


@pytest.mark.timeout(300)
def test_an_import_shows_its_progress_on_a_terminal_counted_from_the_header(sqlite_url,
                                                                            tmp_path):
    """stderr on a terminal (a pty), as an operator runs it: the bar counts the lines the
    header announces."""
    import pty
    import re
    import subprocess
    import sys

    header = json.dumps({"format": "tunecache-export", "version": 1, "entries": 1200,
                         "graphs": 0})
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join([header] + [_entry(gemm_key("mm", i), {"aten": 1.0})
                                          for i in range(1200)]) + "\n")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunecache.cli", "import", str(path), "--db", sqlite_url],
        stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, text=True,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "100"})
    os.close(slave)
    seen = ""
    try:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end closed (the process ended)
                break
            if not chunk:
                break
            seen += chunk.decode(errors="replace")
        stdout, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 0, (stdout, seen)
    assert re.search(r"importing.*\b1200/1200\b", seen), seen
    assert ": 1200 new" in stdout


@pytest.mark.parametrize("policy", ["replace", "faster"])
def test_a_best_only_file_never_replaces_full_timings(db_url, tmp_path, policy):
    # --on-conflict replace of a --best-only file silently replaced an entry's full
    # timings with the winner's alone. The full entry is kept, and the report says why.
    key = gemm_key("mm", 0)
    populate(db_url, [key])  # aten 1.0, triton 2.0
    best = tmp_path / "best.jsonl"
    best.write_text("\n".join([HEADER, _entry(key, {"aten": 0.5, "triton": None}),
                               _entry(gemm_key("mm", 1), {"aten": 0.5, "triton": None})])
                    + "\n")
    out = run("import", str(best), "--db", db_url, "--on-conflict", policy)
    assert out.exit_code == 0, out.output
    assert out.stdout.split(": ", 1)[1] == ("1 new, 0 replaced, 1 kept (1 of them "
                          "with full timings, which the file's winner-only ones would have "
                          f"replaced), 0 busy (being tuned), 0 invalid (on conflict: {policy})"
                          "\n")
    assert out.stdout.startswith("imported into ")
    shown = run_json("show", "--db", db_url, tunecache.keys.key_hash(key)[0])
    assert {t["candidate"]: t["ms"] for t in shown["timings"]} == {"aten": 1.0, "triton": 2.0}
    data = run_json("import", str(best), "--db", db_url, "--on-conflict", policy)
    assert (data["kept"], data["kept_full"], data["replaced"]) == (2, 1, 0)
    # A full file still replaces a full entry.
    full = tmp_path / "full.jsonl"
    full.write_text("\n".join([HEADER, _entry(key, {"aten": 0.5, "triton": 0.7})]) + "\n")
    assert run_json("import", str(full), "--db", db_url, "--on-conflict", policy)[
        "replaced"] == 1


def test_a_file_cut_mid_line_counts_the_cut_line_as_invalid(db_url, tmp_path):
    header = json.dumps({"format": "tunecache-export", "version": 1, "entries": 5,
                         "graphs": 0})
    lines = [header] + [_entry(gemm_key("mm", i), {"aten": 1.0}) for i in range(3)]
    path = tmp_path / "cut.jsonl"
    path.write_text("\n".join(lines)[:-10])  # the third entry cut mid-line
    result = run("import", str(path), "--db", db_url, "--skip-invalid")
    assert result.exit_code == 1
    assert ": 2 new, 0 replaced, 0 kept, 0 busy (being tuned), 1 invalid" in result.stdout
    assert result.stderr.splitlines()[-1] == (
        f"Error: {path}: the file ends after 3 of the 5 lines its header counts: it was cut "
        "short (of the 3 present, 2 were imported and 1 was invalid); import a whole copy "
        "for the rest")
    assert len(run_json("ls", "--db", db_url)) == 2
