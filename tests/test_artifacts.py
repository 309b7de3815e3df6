"""The compiled-graph store (tunecache.store.artifacts): first publish wins across
processes, damaged payloads read as None with one warning, and on SQLite the megabytes are
written outside the database's write lock."""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text, update
from test_concurrency import _gather

from tunecache.errors import ReadonlyModeError, StoreError, StoreTimeoutError
from tunecache.keys import Key
from tunecache.store import ArtifactStore, ClaimStore, Database, ensure_schema
from tunecache.store.artifacts import MAX_KEY_CHARS, TOUCH_SECONDS
from tunecache.store.blobs import BlobDir
from tunecache.store.schema import artifacts

ctx = multiprocessing.get_context("spawn")
SIG = b"\x01" * 64


def _store(url: str, **kw) -> ArtifactStore:
    db = Database(url, **kw)
    ensure_schema(db)
    return ArtifactStore(db)


def _blob_files(url: str) -> list[Path]:
    root = Path(url.removeprefix("sqlite:///") + ".blobs")
    return sorted(p for p in root.glob("??/*") if len(p.name) == 64)


def test_put_then_get_returns_the_published_bytes_and_signature(db_url):
    store = _store(db_url)
    payload = os.urandom(300_000)
    assert store.put("fxgraph", "fabc", payload, SIG, "2.13.0") is True
    got = store.get("fxgraph", "fabc")
    assert got is not None
    assert (got.kind, got.key, got.payload, got.signature, got.torch_version) == (
        "fxgraph", "fabc", payload, SIG, "2.13.0")
    assert got.digest == hashlib.sha256(payload).hexdigest()
    assert store.get("autograd", "fabc") is None  # kinds are separate namespaces
    assert store.get("fxgraph", "other") is None
    if db_url.startswith("sqlite"):
        assert [p.name for p in _blob_files(db_url)] == [got.digest]
        row = store.db.run(lambda c: c.execute(text(
            "SELECT payload FROM tunecache_artifacts")).scalar_one())
        assert row is None, "on SQLite the bytes live in the blob file only"
    store.db.dispose()


def test_second_put_of_a_key_returns_false_and_keeps_the_first_bytes(db_url):
    store = _store(db_url)
    first, second = os.urandom(1000), os.urandom(2000)
    assert store.put("fxgraph", "k", first, SIG, "2.13.0") is True
    assert store.put("fxgraph", "k", second, b"\x02" * 64, "2.13.0") is False
    got = store.get("fxgraph", "k")
    assert (got.payload, got.signature) == (first, SIG)
    if db_url.startswith("sqlite"):
        assert len(_blob_files(db_url)) == 1, "a loser's blob is never written"
    store.db.dispose()


def test_arguments_that_cannot_be_stored_are_refused(db_url):
    store = _store(db_url)
    long_key = "k" * (MAX_KEY_CHARS + 1)
    with pytest.raises(ValueError, match="more than 512"):
        store.put("fxgraph", long_key, b"x", SIG, "2.13.0")
    with pytest.raises(ValueError, match="signature"):
        store.put("fxgraph", "k", b"x", b"", "2.13.0")
    with pytest.raises(ValueError, match="kind"):
        store.put("../x", "k", b"x", SIG, "2.13.0")
    assert store.get("fxgraph", long_key) is None
    assert store.put("fxgraph", "k" * MAX_KEY_CHARS, b"x", SIG, "2.13.0") is True
    assert store.get("fxgraph", "k" * MAX_KEY_CHARS).payload == b"x"
    store.db.dispose()


def _publish_same_key(url: str, barrier, queue) -> None:
    store = ArtifactStore(Database(url))
    # Each rank's pickle of "the same" graph may differ byte for byte.
    payload = os.urandom(2_000_000)
    barrier.wait()
    won = store.put("fxgraph", "fsame", payload, SIG, "2.13.0")
    got = store.get("fxgraph", "fsame")
    queue.put({"won": won, "mine": hashlib.sha256(payload).hexdigest(),
               "read": hashlib.sha256(got.payload).hexdigest()})


def test_first_publish_wins_when_eight_processes_publish_one_key_at_once(db_url):
    _store(db_url).db.dispose()  # migrated before the race
    out = _gather(_publish_same_key, 8, (db_url,), context=ctx)
    winners = [o for o in out if o["won"]]
    assert len(winners) == 1
    assert {o["read"] for o in out} == {winners[0]["mine"]}
    if db_url.startswith("sqlite"):
        assert [p.name for p in _blob_files(db_url)] == [winners[0]["mine"]]


@pytest.mark.parametrize("damage", ["missing", "truncated", "corrupted", "extended"])
def test_damaged_blob_reads_as_none_with_one_warning(sqlite_url, damage, caplog):
    store = _store(sqlite_url)
    payload = os.urandom(50_000)
    store.put("fxgraph", "k", payload, SIG, "2.13.0")
    [blob] = _blob_files(sqlite_url)
    if damage == "missing":
        blob.unlink()
    elif damage == "truncated":
        blob.write_bytes(payload[:-1])
    elif damage == "corrupted":
        blob.write_bytes(payload[:100] + bytes([payload[100] ^ 1]) + payload[101:])
    else:
        blob.write_bytes(payload + b"!")
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert store.get("fxgraph", "k") is None
    assert len(caplog.records) == 1, caplog.text
    assert "\n" not in caplog.records[0].getMessage()
    store.db.dispose()


def test_a_database_copied_without_its_blobs_costs_one_warning_not_one_per_entry(sqlite_url,
                                                                               caplog):
    """A SQLite file copied without the blob directory beside it: every entry's blob is
    missing. Each read is refused, and the process is told once; the next publisher of
    each entry puts its blob back, and that is said once too."""
    store = _store(sqlite_url)
    payloads = {f"k{i}": os.urandom(1_000 + i) for i in range(5)}
    for key, payload in payloads.items():
        store.put("kernel", key, payload, SIG, "2.13.0")
    for blob in _blob_files(sqlite_url):
        blob.unlink()
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert all(store.get("kernel", key) is None for key in payloads)
        assert len(caplog.records) == 1, caplog.text
        assert "further unreadable entries" in caplog.records[0].getMessage()
        caplog.clear()
        for key, payload in payloads.items():
            assert store.put("kernel", key, payload, SIG, "2.13.0") is False
        assert len(caplog.records) == 1, caplog.text
    assert all(store.get("kernel", key).payload == payload for key, payload in payloads.items())
    store.db.dispose()


def test_publishing_the_same_bytes_again_restores_a_lost_blob(sqlite_url):
    store = _store(sqlite_url)
    payload = os.urandom(10_000)
    store.put("fxgraph", "k", payload, SIG, "2.13.0")
    [blob] = _blob_files(sqlite_url)
    blob.unlink()
    assert store.put("fxgraph", "k", payload, SIG, "2.13.0") is False
    assert store.get("fxgraph", "k").payload == payload
    store.db.dispose()


def test_corrupted_postgresql_payload_reads_as_none_with_one_warning(pg_url, caplog):
    store = _store(pg_url)
    store.put("fxgraph", "k", b"abc" * 1000, SIG, "2.13.0")
    store.db.run(lambda c: c.execute(update(artifacts).values(payload=b"abd" * 1000)),
                 write=True)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert store.get("fxgraph", "k") is None
    assert len(caplog.records) == 1 and "digest" in caplog.text
    store.db.dispose()


@pytest.mark.parametrize("column,value", [
    ("size", "'many'"), ("digest", "'../../../../etc/passwd'"), ("digest", "42"),
    ("signature", "'text, not bytes'"), ("created_at", "'yesterday'"),
    ("torch_version", "x'00ff'"),
])
def test_row_of_wrong_typed_columns_reads_as_none_with_one_warning(sqlite_url, column,
                                                                    value, caplog):
    store = _store(sqlite_url)
    store.put("fxgraph", "k", b"payload", SIG, "2.13.0")
    # SQLite keeps whatever it is given, whatever the column's declared type.
    store.db.run(lambda c: c.execute(text(f"UPDATE tunecache_artifacts SET {column} = {value}")),
                 write=True)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert store.get("fxgraph", "k") is None
    assert len(caplog.records) == 1 and "malformed" in caplog.text
    store.db.dispose()


def _last_used(store: ArtifactStore) -> float:
    return store.db.run(lambda c: c.execute(text(
        "SELECT last_used_at FROM tunecache_artifacts")).scalar_one())


def test_a_read_records_its_use_only_once_the_recorded_one_is_an_hour_old(db_url):
    store = _store(db_url)
    store.put("fxgraph", "k", b"payload", SIG, "2.13.0")
    published = _last_used(store)
    assert store.get("fxgraph", "k") is not None
    assert _last_used(store) == published, "a fresh use is not written again"
    old = published - TOUCH_SECONDS - 60
    store.db.run(lambda c: c.execute(update(artifacts).values(last_used_at=old)), write=True)
    assert store.get("fxgraph", "k") is not None
    assert _last_used(store) > old + TOUCH_SECONDS
    store.db.dispose()


def test_readonly_database_serves_reads_without_writing(db_url):
    store = _store(db_url)
    store.put("fxgraph", "k", b"payload", SIG, "2.13.0")
    old = _last_used(store) - 2 * TOUCH_SECONDS
    store.db.run(lambda c: c.execute(update(artifacts).values(last_used_at=old)), write=True)
    reader = ArtifactStore(Database(db_url, readonly=True))
    assert reader.get("fxgraph", "k").payload == b"payload"
    assert _last_used(store) == old
    with pytest.raises(ReadonlyModeError):
        reader.put("fxgraph", "k2", b"x", SIG, "2.13.0")
    if db_url.startswith("sqlite"):
        assert len(_blob_files(db_url)) == 1, "a refused publish leaves no blob behind"
    reader.db.dispose()
    store.db.dispose()


# -- the write lock is free while a blob is written ----------------------------------------

_STOP_AFTER_BLOB = '''
import os, signal, sys
from tunecache.store import ArtifactStore, Database
from tunecache.store.blobs import BlobDir

def stop_when_the_blob_is_written(frame, event, arg):
    # Freeze this process between the blob's write and the row's transaction: the
    # moment a SQLite write lock held "for the megabytes" would still be held.
    if event == "return" and frame.f_code is BlobDir.write.__code__:
        os.kill(os.getpid(), signal.SIGSTOP)

store = ArtifactStore(Database(sys.argv[1]))
sys.setprofile(stop_when_the_blob_is_written)
won = store.put("fxgraph", "fbig", os.urandom(int(sys.argv[2])), b"s" * 64, "2.13.0")
sys.setprofile(None)
print("published" if won else "lost", flush=True)
'''


def _wait_stopped(pid: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        assert time.monotonic() < deadline, "the publisher never reached its blob's end"
        time.sleep(0.02)


def test_claim_succeeds_while_a_publisher_is_frozen_after_writing_its_blob(sqlite_url,
                                                                           tmp_path):
    import subprocess

    store = _store(sqlite_url)
    size = 20 * 2**20
    proc = subprocess.Popen([sys.executable, "-c", _STOP_AFTER_BLOB, sqlite_url, str(size)],
                            stdout=subprocess.PIPE, text=True)
    try:
        _wait_stopped(proc.pid)
        [blob] = _blob_files(sqlite_url)
        assert blob.stat().st_size == size
        # The publisher is frozen with its blob written and its row not yet inserted:
        # a claim (a write transaction) goes through at once.
        claimer = ClaimStore(Database(sqlite_url, lock_timeout=5.0))
        outcome = claimer.step(publish=[], candidates=[Key.of({"kind": "gemm", "i": 1})],
                               limit=1, owner="h:1:x", lease_seconds=30, max_attempts=3)
        assert len(outcome.claimed) == 1
        assert store.get("fxgraph", "fbig") is None  # the row comes after the blob
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "published"
    assert len(store.get("fxgraph", "fbig").payload) == size
    claimer.db.dispose()
    store.db.dispose()


def test_blob_path_refuses_a_digest_that_is_not_one(tmp_path):
    blobs = BlobDir(str(tmp_path / "x.db.blobs"))
    for bad in ("../" * 10 + "etc/passwd", "ab", "A" * 64, "g" * 64):
        with pytest.raises(ValueError):
            blobs.path(bad)


def test_blob_directory_that_cannot_be_written_is_a_store_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    store = _store(url)
    Path(store.blobs.root).write_text("a file where the blob directory goes")
    with pytest.raises(StoreError, match="compiled graph blob"):
        store.put("fxgraph", "k", b"payload", SIG, "2.13.0")
    assert store.get("fxgraph", "k") is None
    store.db.dispose()


def test_publish_waits_for_a_held_blob_lock_at_most_the_lock_timeout(sqlite_url):
    from filelock import FileLock

    store = _store(sqlite_url, lock_timeout=0.5)
    digest = hashlib.sha256(b"payload").hexdigest()
    holder = FileLock(store.blobs.path(digest) + ".lock", is_singleton=False)
    Path(store.blobs.path(digest)).parent.mkdir(parents=True)
    with holder, pytest.raises(StoreTimeoutError):
        store.put("fxgraph", "k", b"payload", SIG, "2.13.0")
    assert store.put("fxgraph", "k", b"payload", SIG, "2.13.0") is True
    store.db.dispose()


def test_blob_dirs_and_locks_are_group_writable_in_a_group_shared_directory(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    store = _store(f"sqlite:///{shared / 'tune.db'}")
    old = os.umask(0o022)  # a user whose umask would keep the group out
    try:
        store.put("fxgraph", "k", b"payload", SIG, "2.13.0")
    finally:
        os.umask(old)
    made = [p for p in Path(store.blobs.root).rglob("*") if p.is_dir() or p.suffix == ".lock"]
    assert made and all(p.stat().st_mode & 0o020 for p in made), [
        (str(p), oct(p.stat().st_mode)) for p in made]
    store.db.dispose()


def test_postgresql_read_errors_are_store_errors(pg_url):
    """The binary read runs on the driver's connection: its errors must still come out as
    the store's, for the core to turn into one warning."""
    store = _store(pg_url)
    store.db.run(lambda c: c.execute(text("ALTER TABLE tunecache_artifacts RENAME TO gone")),
                 write=True)
    with pytest.raises(StoreError, match="tunecache_artifacts"):
        store.get("fxgraph", "k")
    store.db.dispose()


# -- replace: a publisher's compare-and-swap over a row it found unverifiable


def test_replace_swaps_the_row_it_read_and_deletes_the_old_blob(db_url):
    store = _store(db_url)
    old, new = os.urandom(20_000), os.urandom(30_000)
    store.put("fxgraph", "k", old, SIG, "2.12.0")
    found, digest, signature = store.examine("fxgraph", "k")
    assert found.payload == old and digest == hashlib.sha256(old).hexdigest()
    assert store.replace("fxgraph", "k", digest, signature, new, b"\x02" * 64, "2.13.0")
    got = store.get("fxgraph", "k")
    assert (got.payload, got.signature, got.torch_version) == (new, b"\x02" * 64, "2.13.0")
    if db_url.startswith("sqlite"):
        # The old blob is no row's any more: deleted, as prune would.
        assert [p.name for p in _blob_files(db_url)] == [hashlib.sha256(new).hexdigest()]
    store.db.dispose()


def test_replace_of_a_row_that_changed_since_it_was_read_writes_nothing(db_url):
    store = _store(db_url)
    store.put("fxgraph", "k", b"first" * 100, SIG, "2.13.0")
    _, digest, _ = store.examine("fxgraph", "k")
    # Same digest, another signature (a replacer that came first re-signed the bytes).
    assert not store.replace("fxgraph", "k", digest, b"\x09" * 64, b"mine" * 100, SIG,
                             "2.13.0")
    assert not store.replace("fxgraph", "k", "0" * 64, SIG, b"mine" * 100, SIG, "2.13.0")
    assert not store.replace("fxgraph", "gone", digest, SIG, b"mine" * 100, SIG, "2.13.0")
    assert store.get("fxgraph", "k").payload == b"first" * 100
    assert not store.exists("fxgraph", "gone")
    if db_url.startswith("sqlite"):
        assert len(_blob_files(db_url)) == 1, "a replacer that lost wrote no blob"
    store.db.dispose()


def test_replace_over_a_missing_blob_writes_the_new_one(sqlite_url):
    store = _store(sqlite_url)
    store.put("fxgraph", "k", os.urandom(5_000), SIG, "2.13.0")
    [blob] = _blob_files(sqlite_url)
    blob.unlink()
    found, digest, signature = store.examine("fxgraph", "k")
    assert isinstance(found, str) and "missing" in found
    new = os.urandom(6_000)
    assert store.replace("fxgraph", "k", digest, signature, new, SIG, "2.13.0")
    assert store.get("fxgraph", "k").payload == new
    store.db.dispose()


def test_replace_matches_a_malformed_sqlite_row_as_it_was_read(sqlite_url):
    store = _store(sqlite_url)
    store.put("fxgraph", "k", b"x" * 100, SIG, "2.13.0")
    # A hostile writer's row: a number for a digest, text for a signature.
    store.db.run(lambda c: c.execute(text(
        "UPDATE tunecache_artifacts SET digest = 7, signature = 'text'")), write=True)
    found, digest, signature = store.examine("fxgraph", "k")
    assert found == "its database row is malformed"
    assert store.replace("fxgraph", "k", digest, signature, b"y" * 100, SIG, "2.13.0")
    assert store.get("fxgraph", "k").payload == b"y" * 100
    store.db.dispose()


def _replace_one_bad_row(url: str, barrier, queue) -> None:
    store = ArtifactStore(Database(url))
    payload = os.urandom(1_000_000)
    _, digest, signature = store.examine("fxgraph", "fbad")
    barrier.wait()
    won = store.replace("fxgraph", "fbad", digest, signature, payload, SIG, "2.13.0")
    got = store.get("fxgraph", "fbad")
    queue.put({"won": won, "mine": hashlib.sha256(payload).hexdigest(),
               "read": hashlib.sha256(got.payload).hexdigest()})


def test_one_of_six_processes_replacing_one_row_at_once_wins(db_url):
    store = _store(db_url)
    store.put("fxgraph", "fbad", b"bad" * 1000, b"\x07" * 64, "2.13.0")
    out = _gather(_replace_one_bad_row, 6, (db_url,))
    winners = [o for o in out if o["won"]]
    assert len(winners) == 1, out
    assert {o["read"] for o in out} == {winners[0]["mine"]}
    assert store.count() == 1
    if db_url.startswith("sqlite"):
        assert [p.name for p in _blob_files(db_url)] == [winners[0]["mine"]]
    store.db.dispose()
