"""tunecache prune: selections, dry runs, live claims, batches, VACUUM, bad input."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest
from cli_helpers import claim_key, fail_key, gemm_key, populate, run, run_json
from sqlalchemy import column, create_engine, func, select, update

import tunecache
from tunecache.settings import resolve_db_url
from tunecache.store.schema import entries


def _states(url):
    rows = run_json("ls", "--db", url, "--limit", "1000")
    return sorted((r["op"], r["torch"], r["state"]) for r in rows)


def _age(url, key_hashes, seconds):
    """Pretend entries were last used ``seconds`` ago (time is the only thing we fake)."""
    engine = create_engine(resolve_db_url(url))
    with engine.begin() as conn:
        conn.execute(update(entries).where(entries.c.key_hash.in_(key_hashes)).values(
            last_used_at=time.time() - seconds, updated_at=time.time() - seconds))
    engine.dispose()


def test_prune_older_than_with_dry_run(db_url):
    old = populate(db_url, [gemm_key("mm", i) for i in range(3)])
    populate(db_url, [gemm_key("bmm", i) for i in range(2)])
    _age(db_url, [r.key_hash for r in old], 40 * 86400)

    dry = run_json("prune", "--db", db_url, "--older-than", "30d", "--dry-run")
    assert dry["would_delete"] == 3
    assert sorted(e["key_hash"] for e in dry["entries"]) == sorted(r.key_hash for r in old)
    assert len(run_json("ls", "--db", db_url)) == 5  # nothing deleted

    human = run("prune", "--db", db_url, "--older-than", "4w", "--dry-run")
    assert human.stdout.splitlines()[0] == "would delete 3 entries (dry run)"

    result = run("prune", "--db", db_url, "--older-than", "720h", "--no-vacuum")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].startswith("deleted 3 entries in 1 batch (")
    assert result.stdout.splitlines()[1] == "vacuum: skipped (not asked)"
    assert _states(db_url) == [("bmm", "2.13.0", "done")] * 2


def test_prune_by_environment(db_url):
    populate(db_url, [gemm_key("mm", i, torch=t) for i in range(2)
                      for t in ("2.11.0", "2.12.0", "2.13.0")])
    out = run_json("prune", "--db", db_url, "--torch", "2.11.0")
    assert out["deleted"] == 2
    out = run_json("prune", "--db", db_url, "--keep-torch", "2.13.0")
    assert out["deleted"] == 2
    assert _states(db_url) == [("mm", "2.13.0", "done")] * 2
    # keep-device with the only device present: nothing goes
    assert run_json("prune", "--db", db_url, "--keep-device", "cpu-x")["deleted"] == 0


def test_prune_failed_expired_and_never_live_claims(db_url):
    populate(db_url, [gemm_key("mm", 0)])
    fail_key(db_url, gemm_key("mm", 1))
    claim_key(db_url, gemm_key("mm", 2), lease_seconds=600)
    claim_key(db_url, gemm_key("mm", 3), lease_seconds=0.01)

    assert run_json("prune", "--db", db_url, "--failed")["deleted"] == 1
    assert run_json("prune", "--db", db_url, "--expired-claims")["deleted"] == 1
    # Every selection at once, batch size 1: the live claim and nothing but it stays...
    # except the done entry, which only an entry filter would select.
    out = run_json("prune", "--db", db_url, "--failed", "--expired-claims", "--invalid",
                   "--older-than", "0s", "--batch-size", "1")
    assert out["deleted"] == 1  # the done entry (older than 0s)
    assert _states(db_url) == [("mm", "2.13.0", "claimed")]


def test_prune_invalid_entries(db_url):
    good, bad = populate(db_url, [gemm_key("mm", 0), gemm_key("mm", 1)])
    engine = create_engine(resolve_db_url(db_url))
    with engine.begin() as conn:
        conn.execute(update(entries).where(entries.c.key_hash == bad.key_hash)
                     .values(timings_json='{"aten": -1}'))
    engine.dispose()
    dry = run_json("prune", "--db", db_url, "--invalid", "--dry-run")
    assert [(e["key_hash"], e["invalid"]) for e in dry["entries"]] == [
        (bad.key_hash, "timing of 'aten' is -1")]
    assert run_json("prune", "--db", db_url, "--invalid")["deleted"] == 1
    assert [r["key_hash"] for r in run_json("ls", "--db", db_url)] == [good.key_hash]


def test_prune_many_batches_and_vacuum(sqlite_url):
    populate(sqlite_url, [gemm_key("mm", i, torch="2.12.0") for i in range(300)])
    populate(sqlite_url, [gemm_key("mm", i) for i in range(10)])
    out = run_json("prune", "--db", sqlite_url, "--torch", "2.12.0", "--batch-size", "64")
    assert out["deleted"] == 300 and out["batches"] == 5
    assert out["vacuum"]["ran"] is True and out["vacuum"]["why"].startswith("free pages were")
    assert out["size_after"]["bytes"] < out["size_before"]["bytes"]
    assert len(run_json("ls", "--db", sqlite_url)) == 10


def test_sqlite_batches_are_sized_by_time(sqlite_url, monkeypatch):
    """Without --batch-size, each SQLite batch may take as many rows as the last one's pace
    fits in PRUNE_BATCH_SECONDS, at most twice the last; --batch-size fixes the size."""
    from tunecache.ops import pruning as prune_mod

    populate(sqlite_url, [gemm_key("mm", i, torch="2.12.0") for i in range(300)])
    populate(sqlite_url, [gemm_key("mm", i) for i in range(10)])
    monkeypatch.setitem(prune_mod.PRUNE_BATCH, "sqlite", 2)
    monkeypatch.setattr(prune_mod, "PRUNE_BATCH_MIN", 1)
    monkeypatch.setattr(prune_mod, "PRUNE_BATCH_SECONDS", 3600.0)  # every batch "fast"
    out = run_json("prune", "--db", sqlite_url, "--torch", "2.12.0", "--no-pause")
    # 2 + 4 + ... + 128 = 254 rows, then the last 46 in a batch of up to 256
    assert (out["deleted"], out["batches"], out["largest_batch"]) == (300, 8, 128)
    assert len(run_json("ls", "--db", sqlite_url)) == 10


def test_next_batch_size_follows_the_pace():
    from tunecache.ops import pruning as m

    assert m._next_batch_size(5000, 0.25) == 10000  # fast: at most doubles
    assert m._next_batch_size(20000, 2.0) == 10000  # slow (a network filesystem): shrinks
    assert m._next_batch_size(20000, 1.0) == 20000
    assert m._next_batch_size(1000, 60.0) == m.PRUNE_BATCH_MIN
    assert m._next_batch_size(40000, 0.5) == m.PRUNE_BATCH_MAX


def test_prune_bad_arguments(db_url):
    populate(db_url, [gemm_key("mm", 0)])
    for value in ("30x", "-3d", "d", ""):
        result = run("prune", "--db", db_url, "--older-than", value)
        assert result.exit_code == 2, value
        assert result.stderr.splitlines()[-1] == (
            f"Error: Invalid value for '--older-than': {value!r} is not a duration "
            "(use 3600s, 90m, 12h, 30d or 2w) (see 'tunecache prune --help')")
    for value in ("30", "0", "1.5"):
        result = run("prune", "--db", db_url, "--older-than", value)
        assert result.exit_code == 2, value
        assert result.stderr.splitlines()[-1] == (
            f"Error: Invalid value for '--older-than': {value!r} has no unit: use s, m, h, d "
            f"or w ({value}d is {value} days, {value}s {value} seconds) (see 'tunecache prune "
            "--help')")
    nothing = run("prune", "--db", db_url)
    assert nothing.exit_code == 2
    assert nothing.stderr.startswith("Error: nothing selected: give --older-than")
    assert len(run_json("ls", "--db", db_url)) == 1


def test_auto_vacuum_skips_big_files(sqlite_url, monkeypatch):
    from tunecache.ops import pruning as prune_mod

    populate(sqlite_url, [gemm_key("mm", i, torch="2.12.0") for i in range(200)])
    monkeypatch.setattr(prune_mod, "VACUUM_AUTO_MAX_BYTES", 1024)
    out = run_json("prune", "--db", sqlite_url, "--torch", "2.12.0", "--no-pause")
    assert out["deleted"] == 200 and out["vacuum"]["ran"] is False
    assert "run `tunecache prune --vacuum ...` when no job runs" in out["vacuum"]["why"]
    forced = run_json("prune", "--db", sqlite_url, "--failed", "--vacuum")
    assert forced["vacuum"] == {"ran": True, "why": "asked", "seconds": forced["vacuum"]["seconds"]}


def test_prune_leaves_the_pooled_sqlite_connection_as_it_found_it(sqlite_url):
    """The prune's big page cache is per batch: a library caller's connection, back in
    the pool, does not keep 256 MiB of pages for the rest of its process."""
    from tunecache.ops import pruning as prune_mod
    from tunecache.store import Database

    populate(sqlite_url, [gemm_key("mm", i, torch="2.12.0") for i in range(20)])
    db = Database(resolve_db_url(sqlite_url))
    pragmas = ("PRAGMA cache_size", "PRAGMA secure_delete")

    def read() -> list:
        return db.run(lambda c: [c.exec_driver_sql(p).scalar() for p in pragmas], write=True)

    before = read()
    report = prune_mod.prune(db, prune_mod.PruneSpec(only={"torch": ["2.12.0"]}),
                             batch=8, vacuum="never")
    assert report.deleted == 20 and report.batches == 3
    assert read() == before
    db.dispose()


def test_readonly_mode_refuses_every_command_that_writes(db_url, tmp_path, monkeypatch):
    """TUNECACHE_MODE=readonly: prune, import, merge and upgrade refuse in one line and
    change nothing (prune deleted 50 rows before); reading commands still work, and the
    library functions refuse too."""
    from tunecache import ops
    from tunecache.errors import ReadonlyModeError
    from tunecache.store import Database

    populate(db_url, [gemm_key("mm", i) for i in range(3)])
    export = tmp_path / "x.jsonl"
    assert run("export", "--db", db_url, "-o", str(export)).exit_code == 0
    src = tmp_path / "src.db"
    populate(str(src), [gemm_key("bmm", 0)])
    display = Database(resolve_db_url(db_url)).display_url

    monkeypatch.setenv("TUNECACHE_MODE", "readonly")
    for command in (["prune", "--older-than", "0s"], ["prune", "--failed", "--invalid"],
                    ["import", str(export)], ["merge", str(src)], ["upgrade"]):
        result = run(*command, "--db", db_url)
        assert result.exit_code == 1, command
        assert result.stderr == (
            f"Error: tunecache database {display}: {command[0]} writes to the database, and "
            "TUNECACHE_MODE=readonly forbids writes; run it with TUNECACHE_MODE=readwrite\n")
    assert run_json("prune", "--db", db_url, "--older-than", "0s", "--dry-run")[
        "would_delete"] == 3
    assert run_json("stats", "--db", db_url)["entries"]["total"] == 3

    db = Database(resolve_db_url(db_url), readonly=True)
    try:
        with pytest.raises(ReadonlyModeError):
            ops.prune(db, ops.PruneSpec(older_than=0.0))
        with pytest.raises(ReadonlyModeError):
            ops.import_records(db, [])
    finally:
        db.dispose()
    monkeypatch.delenv("TUNECACHE_MODE")
    assert len(run_json("ls", "--db", db_url)) == 3


# A writer that never sees the stop file gives up after this many keys (exit 3), so a
# prune that chases its inserts fails the test instead of hanging it.
WRITER_CAP = 20_000
ROWID = column("rowid")


def _publish_until(url: str, stop: Path, first: int) -> None:
    """A running job: publishes new keys, one by one, until the test says stop."""
    with tunecache.open(url) as cache:
        for i in range(first, first + WRITER_CAP):
            if stop.exists():
                return
            cache.get_or_tune(gemm_key("mm", i, torch="later"), lambda: {"aten": 1.0})
    raise SystemExit(3)


def test_sqlite_prune_stops_where_the_table_ended_when_it_started(sqlite_url, tmp_path):
    """`--older-than 0s` matches every row a running job inserts meanwhile too; the prune
    deletes up to the last rowid it read at its start, then returns, while the writers
    still publish (it chased their inserts until they stopped: 16-19 s on 300 keys)."""
    from tunecache.ops import pruning as prune_mod
    from tunecache.store import Database

    populate(sqlite_url, [gemm_key("mm", i) for i in range(300)])
    stop = tmp_path / "stop"
    ctx = mp.get_context("fork")
    writers = [ctx.Process(target=_publish_until, args=(sqlite_url, stop, 10**6 * (n + 1)))
               for n in range(2)]
    db = Database(resolve_db_url(sqlite_url))
    newer: list[str] = []

    def after_a_batch(_n: int) -> None:
        if newer:
            return
        # The prune read its end before its first batch: rows inserted from here on are
        # past it. Wait until the writers have put a few there.
        mark = db.run(lambda c: c.execute(select(func.max(ROWID)).select_from(entries))
                      .scalar_one())
        past = select(entries.c.key_hash).where(mark < ROWID)
        while len(newer) < 20:
            assert any(w.is_alive() for w in writers), "the writers died"
            time.sleep(0.02)
            newer[:] = db.run(lambda c: c.execute(past).scalars().all())

    for w in writers:
        w.start()
    try:
        report = prune_mod.prune(db, prune_mod.PruneSpec(older_than=0.0), batch=50,
                                 progress=after_a_batch, vacuum="never")
    finally:
        stop.touch()
        for w in writers:
            w.join()
    # Stopped by the test, not by their cap: the prune returned while they published.
    assert [w.exitcode for w in writers] == [0, 0]
    left = set(db.run(lambda c: c.execute(select(entries.c.key_hash)).scalars().all()))
    db.dispose()
    assert len(newer) >= 20 and set(newer) <= left
    assert report.deleted >= 300
    assert run_json("ls", "--db", sqlite_url, "--torch", "2.13.0") == []  # the 300 went


def test_keep_filter_that_matches_no_stored_version_is_refused_and_deletes_nothing(db_url):
    # The README's example on the torch the demo installs: its entries say 2.13.0+cpu.
    populate(db_url, [gemm_key("mm", i, torch="2.13.0+cpu") for i in range(3)])
    populate(db_url, [gemm_key("mm", 9, torch="2.12.0")])
    for args in (["--keep-torch", "2.13.0"], ["--keep-torch", "2.13.0+cpu", "--keep-torch",
                                               "2.14.0"], ["--keep-device", "cpu"],
                 ["--keep-triton", "3.1"]):
        for dry in ([], ["--dry-run"]):
            result = run("prune", "--db", db_url, *args, *dry)
            assert result.exit_code == 2, (args, result.output)
            [line] = result.stderr.splitlines()
            assert "matches no stored" in line, line
    result = run("prune", "--db", db_url, "--keep-torch", "2.13.0")
    assert "2.12.0, 2.13.0+cpu" in result.stderr and "--keep-torch 2.12.0" in result.stderr
    assert len(run_json("ls", "--db", db_url)) == 4
    assert run_json("prune", "--db", db_url, "--keep-torch", "2.13.0+cpu")["deleted"] == 1


def test_drop_filter_that_matches_no_stored_version_warns(db_url):
    populate(db_url, [gemm_key("mm", 0, torch="2.13.0+cpu")])
    result = run("prune", "--db", db_url, "--torch", "2.13.0", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["deleted"] == 0
    assert "--torch 2.13.0 matches no stored torch version" in result.stderr
    assert "2.13.0+cpu" in result.stderr


def test_prune_refuses_an_unknown_kind_and_names_the_known_ones(db_url):
    populate(db_url, [gemm_key("mm", 0), {"kind": "my_tuner", "i": 1}])
    result = run("prune", "--db", db_url, "--kind", "gemmm", "--older-than", "0s")
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert "gemmm" in line
    assert ("gemm, triton_config, fusion_benchmark, fusion_decision, user_kernel, fxgraph, "
            "autograd") in line
    assert "my_tuner" in line  # a kind written through the API is known too
    assert len(run_json("ls", "--db", db_url)) == 2
    assert run_json("prune", "--db", db_url, "--kind", "my_tuner", "--older-than",
                    "0s")["deleted"] == 1
    assert run_json("prune", "--db", db_url, "--kind", "autograd", "--older-than",
                    "0s")["deleted"] == 0


def _count(url: str) -> int:
    engine = create_engine(resolve_db_url(url))
    with engine.connect() as conn:
        n = conn.execute(select(func.count()).select_from(entries)).scalar_one()
    engine.dispose()
    return n


@pytest.mark.timeout(300)
def test_ctrl_c_during_a_prune_says_how_many_were_deleted_and_exits_130(db_url):
    """A real prune process, its stderr on a terminal so that it draws its progress bar;
    SIGINT once the bar has moved. The prune stops after the batch in hand, prints what
    it deleted, which is exactly what is gone, and exits 130."""
    import os
    import pty
    import re
    import signal
    import subprocess
    import sys

    populate(db_url, [gemm_key("mm", i, torch="2.12.0") for i in range(1500)])
    populate(db_url, [gemm_key("mm", i) for i in range(5)])
    before = _count(db_url)
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "100"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunecache.cli", "prune", "--db", db_url, "--torch", "2.12.0",
         "--batch-size", "5"],
        stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env, text=True)
    os.close(slave)
    seen = ""
    try:
        # Read the terminal until the bar shows rows deleted.
        while not any(int(n) > 0 for n in re.findall(r"(\d+) deleted", seen)):
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end closed (the process ended)
                chunk = b""
            assert chunk, f"the prune ended before showing progress: {seen!r}"
            seen += chunk.decode(errors="replace")
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert proc.returncode == 130, stdout
    [line] = stdout.splitlines()
    deleted = int(re.match(r"interrupted: deleted (\d+) entries \(of them 0 invalid\)",
                           line).group(1))
    assert 0 < deleted < 1500
    assert before - _count(db_url) == deleted


def test_a_dry_run_says_which_selection_took_each_row(db_url):
    old = populate(db_url, [gemm_key("mm", 0)])
    fail_key(db_url, gemm_key("mm", 1))
    claim_key(db_url, gemm_key("mm", 2), lease_seconds=0.01)
    _age(db_url, [old[0].key_hash], 40 * 86400)
    dry = run_json("prune", "--db", db_url, "--older-than", "30d", "--failed",
                   "--expired-claims", "--dry-run")
    assert sorted((e["state"], e["why"]) for e in dry["entries"]) == [
        ("claimed", "--expired-claims"), ("done", "--older-than"), ("failed", "--failed")]
    human = run("prune", "--db", db_url, "--older-than", "30d", "--dry-run")
    assert human.stdout.splitlines()[2].endswith("  --older-than"), human.stdout


def test_prune_reports_the_running_count_of_rows_deleted(db_url):
    populate(db_url, [gemm_key("mm", i, torch="2.12.0") for i in range(30)])
    from tunecache import ops
    from tunecache.ops.opening import opened
    from tunecache.settings import Settings

    counts: list[int] = []
    with opened(Settings.from_env(db=db_url)) as db:
        report = ops.prune(db, ops.PruneSpec(only={"torch": ["2.12.0"]}), batch=8,
                           on_deleted=counts.append)
    assert report.deleted == 30 and counts == [8, 16, 24, 30]


def test_a_310_digit_number_in_a_row_is_found_listed_and_removed_by_prune_invalid(db_url):
    good, bad, big = populate(db_url, [gemm_key("mm", i) for i in range(3)])
    huge = "1" + "0" * 309
    engine = create_engine(resolve_db_url(db_url))
    with engine.begin() as conn:
        conn.execute(update(entries).where(entries.c.key_hash == bad.key_hash).values(
            key_json='{"kind": "gemm", "inputs": ' + huge + "}",
            timings_json='{"aten": ' + huge + "}", meta_json='{"x": ' + huge + "}"))
        # Past the key's limit: the database hands back NULL, never the 70 KB.
        conn.execute(update(entries).where(entries.c.key_hash == big.key_hash).values(
            key_json='{"pad": "' + "x" * 70_000 + '"}'))
    engine.dispose()
    shown = run("show", bad.key_hash, "--db", db_url)
    assert shown.exit_code == 0
    assert "key: INVALID (key is out of range (number 10000000000000000000\u2026))" \
        in shown.stdout
    assert "timings: INVALID (timings are out of range (number 10000000000000000000\u2026))" \
        in shown.stdout
    assert run_json("show", big.key_hash, "--db", db_url)["key_error"] == \
        "key missing or larger than 65536 bytes"
    dry = run_json("prune", "--db", db_url, "--invalid", "--dry-run")
    assert sorted(e["key_hash"] for e in dry["entries"]) == sorted([bad.key_hash,
                                                                   big.key_hash])
    assert run_json("prune", "--db", db_url, "--invalid")["deleted"] == 2
    assert [r["key_hash"] for r in run_json("ls", "--db", db_url)] == [good.key_hash]


def test_a_dry_run_counts_every_match_in_sql_and_lists_only_the_first(db_url):
    # It paged through every match to print 20 of them: 20-30 s on 100,000 entries
    # (tools/bench_prune_dry_run.py). Now it counts them all and lists --limit.
    old = populate(db_url, [gemm_key("mm", i) for i in range(30)])
    _age(db_url, [r.key_hash for r in old], 40 * 86400)
    first = sorted(r.key_hash for r in old)
    dry = run_json("prune", "--db", db_url, "--older-than", "30d", "--dry-run", "--limit", "5")
    assert dry["would_delete"] == 30
    assert [e["key_hash"] for e in dry["entries"]] == first[:5]
    lines = run("prune", "--db", db_url, "--older-than", "30d", "--dry-run").stdout.splitlines()
    assert lines[0] == "would delete 30 entries (dry run)"
    assert [line.split()[0] for line in lines[2:22]] == [h[:12] for h in first[:20]]
    assert lines[22] == "  ... and 10 more (--limit lists more)"
    one = run("prune", "--db", db_url, "--older-than", "30d", "--op", "mm", "--dry-run",
              "--limit", "0").stdout.splitlines()
    assert one == ["would delete 30 entries (dry run)", "  ... and 30 more (--limit lists more)"]


def test_a_dry_run_counts_an_invalid_entry_another_selection_takes_once(db_url):
    old, bad, fresh = populate(db_url, [gemm_key("mm", i) for i in range(3)])
    _age(db_url, [old.key_hash, bad.key_hash], 40 * 86400)
    engine = create_engine(resolve_db_url(db_url))
    with engine.begin() as conn:
        for h in (bad.key_hash, fresh.key_hash):
            conn.execute(update(entries).where(entries.c.key_hash == h).values(
                timings_json='{"aten": "slow"}'))
    engine.dispose()
    dry = run_json("prune", "--db", db_url, "--older-than", "30d", "--invalid", "--dry-run")
    assert dry["would_delete"] == 3
    assert sorted((e["key_hash"], e["why"].split(":")[0]) for e in dry["entries"]) == sorted([
        (old.key_hash, "--older-than"), (bad.key_hash, "--older-than --invalid"),
        (fresh.key_hash, "--invalid")])
    one = run("prune", "--db", db_url, "--older-than", "30d", "--invalid", "--dry-run")
    assert one.stdout.splitlines()[0] == "would delete 3 entries (dry run)"
