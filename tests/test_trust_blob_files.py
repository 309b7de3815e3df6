"""Blob files of compiled graphs on storage other users can write (SQLite's
``<db>.blobs``): prune never follows a symlink out of the blob directory and touches only
regular files of the names the store writes; a lock file that is a symlink is refused,
never opened; a blob that is a FIFO is refused without blocking; and a row claiming more
bytes than the store ever writes is refused before anything is read."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from pathlib import Path

import pytest
from cli_helpers import run, run_json
from fifo_helpers import returns_within
from sqlalchemy import update

from tunecache.errors import StoreError
from tunecache.settings import resolve_db_url
from tunecache.store import ArtifactStore, Database, ensure_schema
from tunecache.store.artifacts import MAX_PAYLOAD_BYTES
from tunecache.store.blobs import ORPHAN_SECONDS
from tunecache.store.schema import artifacts

SIG = b"\x07" * 64
OLD = time.time() - ORPHAN_SECONDS - 600


def _store(url: str) -> ArtifactStore:
    db = Database(resolve_db_url(url))
    ensure_schema(db)
    return ArtifactStore(db)


def _root(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///") + ".blobs")


def _old_file(path: Path, data: bytes = b"precious") -> Path:
    path.write_bytes(data)
    os.utime(path, (OLD, OLD), follow_symlinks=False)
    return path


def _victim(tmp_path: Path, prefix: str) -> tuple[Path, list[Path]]:
    """A directory outside the cache holding old files of every name prune deletes."""
    victim = tmp_path / "victim"
    victim.mkdir()
    digest = prefix + hashlib.sha256(b"victim").hexdigest()[len(prefix):]
    files = [_old_file(victim / digest), _old_file(victim / (digest + ".lock")),
             _old_file(victim / (digest + ".tmp.123.abcdef12")),
             _old_file(victim / "build.lock"), _old_file(victim / "x.tmp.y")]
    return victim, files


# -- prune and symlinks


def _payload_outside(shard: str) -> bytes:
    """Random bytes whose blob does not land in ``shard``, which the test plants itself
    (a random digest would fall there one time in 256)."""
    while True:
        payload = os.urandom(100)
        if not hashlib.sha256(payload).hexdigest().startswith(shard):
            return payload


def test_prune_never_follows_a_symlinked_shard_out_of_the_blob_directory(sqlite_url, tmp_path):
    store = _store(sqlite_url)
    store.put("fxgraph", "kept", _payload_outside("ee"), SIG, "2.13.0")
    victim, files = _victim(tmp_path, "ee")
    (_root(sqlite_url) / "ee").symlink_to(victim)
    out = run_json("prune", "--db", sqlite_url, "--max-graph-bytes", "1GB")
    assert out["graphs"]["orphans"] == {"orphan_blobs": 0, "orphan_bytes": 0,
                                        "stale_files": 0}
    assert all(f.read_bytes() == b"precious" for f in files)
    assert store.get("fxgraph", "kept") is not None


@pytest.mark.parametrize("where", ["keys", "keys/ee"])
def test_prune_never_follows_a_symlinked_key_lock_directory(sqlite_url, tmp_path, where):
    store = _store(sqlite_url)
    store.put("fxgraph", "kept", _payload_outside("ee"), SIG, "2.13.0")
    victim, files = _victim(tmp_path, "ee")
    keys = _root(sqlite_url) / "keys"
    keys.mkdir(exist_ok=True)
    if where == "keys":  # keys/ itself: pointed at a directory whose shard is the victim
        outer = tmp_path / "outer"
        outer.mkdir()
        victim.rename(outer / "ee")
        files = [outer / "ee" / f.name for f in files]
        keys.rename(keys.with_name("moved"))
        keys.symlink_to(outer)
    else:
        (keys / "ee").symlink_to(victim)
    run_json("prune", "--db", sqlite_url, "--max-graph-bytes", "1GB")
    assert all(f.read_bytes() == b"precious" for f in files)


def test_a_symlinked_blob_root_is_the_operators_volume_and_is_pruned(tmp_path):
    # The root itself may live on another volume (an operator's symlink); what is below
    # it is still never followed.
    volume = tmp_path / "volume"
    volume.mkdir()
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    _root(url).symlink_to(volume)
    _store(url).put("fxgraph", "kept", os.urandom(100), SIG, "2.13.0")
    data = os.urandom(300)
    digest = hashlib.sha256(data).hexdigest()
    (volume / digest[:2]).mkdir(exist_ok=True)
    orphan = _old_file(volume / digest[:2] / digest, data)
    out = run_json("prune", "--db", url, "--max-graph-bytes", "1GB")
    assert out["graphs"]["orphans"]["orphan_blobs"] == 1 and not orphan.exists()
    assert _store(url).get("fxgraph", "kept") is not None


def test_a_database_reached_through_a_symlinked_directory_makes_its_blob_root(tmp_path):
    (tmp_path / "volume").mkdir()
    (tmp_path / "scratch").symlink_to(tmp_path / "volume")
    url = f"sqlite:///{tmp_path / 'scratch' / 'tune.db'}"
    store = _store(url)
    assert store.put("fxgraph", "k", b"payload", SIG, "2.13.0")
    assert store.get("fxgraph", "k").payload == b"payload"


def test_prune_touches_only_regular_files_of_the_names_the_store_writes(sqlite_url, tmp_path):
    store = _store(sqlite_url)
    store.put("fxgraph", "kept", _payload_outside("ee"), SIG, "2.13.0")
    prefix = "ee"
    shard = _root(sqlite_url) / prefix
    shard.mkdir()
    strangers = [_old_file(shard / "build.lock"), _old_file(shard / "x.tmp.y"),
                 _old_file(shard / "notes.txt")]
    target = _old_file(tmp_path / "target")
    link = shard / (prefix + "0" * 62)  # a blob's name, but a symlink
    link.symlink_to(target)
    fifo = shard / (prefix + "1" * 62)
    os.mkfifo(fifo)
    os.utime(link, (OLD, OLD), follow_symlinks=False)
    os.utime(fifo, (OLD, OLD))
    ours = _old_file(shard / (prefix + "2" * 62 + ".tmp.77.0123abcd"))
    run_json("prune", "--db", sqlite_url, "--max-graph-bytes", "1GB")
    assert all(f.exists() for f in strangers) and link.is_symlink() and fifo.exists()
    assert target.read_bytes() == b"precious"
    assert not ours.exists(), "a dead writer's temporary file is still swept"


# -- lock files that are symlinks


@pytest.fixture
def private_key(tmp_path) -> Path:
    key = tmp_path / "secret.key"
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nsecret\n")
    key.chmod(0o600)
    return key


def test_a_blob_lock_symlinked_to_a_private_key_is_refused_and_the_key_untouched(
        sqlite_url, private_key):
    store = _store(sqlite_url)
    payload = os.urandom(1000)
    digest = hashlib.sha256(payload).hexdigest()
    shard = _root(sqlite_url) / digest[:2]
    shard.mkdir(parents=True)
    (shard / (digest + ".lock")).symlink_to(private_key)
    with pytest.raises(StoreError, match="is a symbolic link, not a regular file"):
        store.put("fxgraph", "k", payload, SIG, "2.13.0")
    assert private_key.read_bytes() == b"-----BEGIN PRIVATE KEY-----\nsecret\n"
    assert stat.S_IMODE(private_key.stat().st_mode) == 0o600


def test_prune_skips_a_blob_whose_lock_is_a_symlink_with_one_line(sqlite_url, private_key,
                                                                  caplog):
    store = _store(sqlite_url)
    store.put("fxgraph", "kept", os.urandom(100), SIG, "2.13.0")
    data = os.urandom(300)
    digest = hashlib.sha256(data).hexdigest()
    shard = _root(sqlite_url) / digest[:2]
    shard.mkdir(exist_ok=True)
    orphan = _old_file(shard / digest, data)
    lock = shard / (digest + ".lock")
    lock.symlink_to(private_key)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        done = run("prune", "--db", sqlite_url, "--max-graph-bytes", "1GB", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["graphs"]["orphans"]["orphan_blobs"] == 0
    warned = [r.getMessage() for r in caplog.records if str(lock) in r.getMessage()]
    assert len(warned) == 1 and "not a regular file" in warned[0], caplog.text
    assert "\n" not in warned[0]
    assert orphan.exists() and lock.is_symlink()
    assert private_key.read_bytes() == b"-----BEGIN PRIVATE KEY-----\nsecret\n"


# -- FIFOs and sizes


def _fifo_blob(url: str, store: ArtifactStore) -> Path:
    store.put("fxgraph", "k", os.urandom(1000), SIG, "2.13.0")
    [blob] = [p for p in _root(url).glob("??/*") if len(p.name) == 64]
    blob.unlink()
    os.mkfifo(blob)
    return blob


def test_a_blob_that_is_a_fifo_reads_as_none_without_blocking(sqlite_url, caplog):
    store = _store(sqlite_url)
    fifo = _fifo_blob(sqlite_url, store)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert returns_within(lambda: store.get("fxgraph", "k"), fifo) is None
    assert len(caplog.records) == 1 and "not a regular file" in caplog.text, caplog.text


def test_export_skips_a_blob_that_is_a_fifo_without_blocking(sqlite_url, tmp_path):
    store = _store(sqlite_url)
    fifo = _fifo_blob(sqlite_url, store)
    out = tmp_path / "export.jsonl"
    done = returns_within(lambda: run("export", "--db", sqlite_url, "--output", str(out),
                                       "--json"), fifo)
    assert done.exit_code == 0, done.output
    [skipped] = json.loads(done.stdout)["skipped_invalid"]
    assert "not a regular file" in skipped["reason"]


def test_a_row_claiming_more_than_the_store_writes_is_refused_before_reading(db_url, caplog):
    store = _store(db_url)
    store.put("fxgraph", "k", b"payload", SIG, "2.13.0")
    huge = MAX_PAYLOAD_BYTES + 1
    store.db.run(lambda c: c.execute(update(artifacts).values(size=huge)), write=True)
    if db_url.startswith("sqlite"):
        [blob] = [p for p in _root(db_url).glob("??/*") if len(p.name) == 64]
        with open(blob, "r+b") as f:  # sparse: as large as the row claims
            f.truncate(huge)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert store.get("fxgraph", "k") is None
    assert len(caplog.records) == 1, caplog.text
    assert f"claims {huge} bytes, more than the store's limit of {MAX_PAYLOAD_BYTES}" \
        in caplog.text


def test_a_postgresql_payload_longer_than_its_row_says_is_refused(pg_url, caplog):
    store = _store(pg_url)
    store.put("fxgraph", "k", b"payload", SIG, "2.13.0")
    store.db.run(lambda c: c.execute(update(artifacts).values(payload=b"x" * 100_000)),
                 write=True)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert store.get("fxgraph", "k") is None
    assert "its payload has 100000 bytes, not 7" in caplog.text
