"""Signed compiled graphs without Inductor: key pairs (tunecache.core.signing and
`tunecache keygen`), the graph service's publish and verify-before-decompress load
(tunecache.core.signed_artifacts, tunecache.core.graphs) over the real artifact store,
each kind's bound (tunecache.core.kernels), and the graph settings."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import zlib
from pathlib import Path

import pytest
from cli_helpers import run
from sqlalchemy import delete, update

import tunecache
from tunecache.core.graphs import GraphShare
from tunecache.core.kernels import KernelShare
from tunecache.core.signing import (
    PRIVATE_KEY_NAME,
    PUBLIC_KEY_NAME,
    load_signer,
    load_verifier,
    signed_message,
    write_key_pair,
)
from tunecache.errors import SigningKeyError
from tunecache.settings import Settings
from tunecache.store import ArtifactStore
from tunecache.store.schema import artifacts

DIGEST = "ab" * 32


@pytest.fixture
def keys(tmp_path) -> Path:
    write_key_pair(tmp_path / "keys")
    return tmp_path / "keys"


def _share(url: str, keys: Path, *, publish: bool = True,
           **settings) -> tuple[GraphShare, tunecache.TuneCache]:
    cache = tunecache.open(url, **settings)
    if publish:
        plan = Settings.from_env({}, signing_key=str(keys / PRIVATE_KEY_NAME)).graph_sharing()
    else:
        plan = Settings.from_env({}, verify_key=str(keys / PUBLIC_KEY_NAME)).graph_sharing()
    return GraphShare.from_settings(plan, lambda: cache), cache


# -- signatures


def test_signature_verifies_only_for_its_kind_key_and_digest(keys):
    signer = load_signer(keys / PRIVATE_KEY_NAME)
    verifier = load_verifier(keys / PUBLIC_KEY_NAME)
    signature = signer.sign("fxgraph", "k1", DIGEST)
    assert verifier.verify("fxgraph", "k1", DIGEST, signature)
    assert not verifier.verify("fxgraph", "k2", DIGEST, signature)  # moved to another key
    assert not verifier.verify("autograd", "k1", DIGEST, signature)  # or another kind
    assert not verifier.verify("fxgraph", "k1", "cd" * 32, signature)  # other bytes
    # A flipped bit, not a byte set to zero: an Ed25519 signature's last byte is below 16,
    # so it is already zero in one signature of sixteen.
    assert not verifier.verify("fxgraph", "k1", DIGEST, bytes([signature[0] ^ 1]) + signature[1:])
    assert not verifier.verify("fxgraph", "k1", DIGEST, signature[:-1] + bytes([signature[-1] ^ 1]))
    assert not verifier.verify("fxgraph", "k1", DIGEST, b"")


def test_signed_message_is_unambiguous_where_fields_could_run_together():
    assert signed_message("fx", "graphkey", DIGEST) != signed_message("fxgraph", "key", DIGEST)


def test_another_key_pair_does_not_verify(keys, tmp_path):
    other = write_key_pair(tmp_path / "other")
    signature = load_signer(other.private_key).sign("fxgraph", "k", DIGEST)
    assert not load_verifier(keys / PUBLIC_KEY_NAME).verify("fxgraph", "k", DIGEST, signature)


# -- key files and `tunecache keygen`


def test_keygen_writes_a_private_key_only_its_owner_reads_and_a_public_key(tmp_path):
    done = run("keygen", str(tmp_path / "k"), "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    private, public = Path(report["private_key"]), Path(report["public_key"])
    assert (private.name, public.name) == (PRIVATE_KEY_NAME, PUBLIC_KEY_NAME)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    signer, verifier = load_signer(private), load_verifier(public)
    assert signer.fingerprint == verifier.fingerprint == report["fingerprint"]
    assert verifier.verify("fxgraph", "k", DIGEST, signer.sign("fxgraph", "k", DIGEST))


def test_keygen_group_lets_the_group_read_the_private_key(tmp_path):
    old = os.umask(0o077)  # a strict umask must not take the group's read away
    try:
        done = run("keygen", str(tmp_path / "k"), "--group", "--json")
    finally:
        os.umask(old)
    assert done.exit_code == 0, done.output
    private = Path(json.loads(done.stdout)["private_key"])
    assert stat.S_IMODE(private.stat().st_mode) == 0o640
    load_signer(private)  # not readable by others: accepted


@pytest.mark.parametrize("existing", [PRIVATE_KEY_NAME, PUBLIC_KEY_NAME])
def test_keygen_refuses_to_overwrite_either_key_file(tmp_path, existing):
    folder = tmp_path / "k"
    folder.mkdir()
    (folder / existing).write_bytes(b"precious")
    done = run("keygen", str(folder))
    assert done.exit_code == 1
    assert "exists already; refusing to overwrite it" in done.output
    assert (folder / existing).read_bytes() == b"precious"
    assert sorted(p.name for p in folder.iterdir()) == [existing]  # nothing else written


def test_a_private_key_everyone_can_read_is_refused(keys):
    private = keys / PRIVATE_KEY_NAME
    private.chmod(0o644)
    with pytest.raises(SigningKeyError, match="readable by every user"):
        load_signer(private)


@pytest.mark.parametrize("content", [b"", b"not a key", b"-----BEGIN PUBLIC KEY-----\nAAAA\n"])
def test_a_key_file_that_is_not_a_key_is_a_one_line_error(tmp_path, content):
    path = tmp_path / "key"
    path.write_bytes(content)
    path.chmod(0o600)
    for load in (load_signer, load_verifier):
        with pytest.raises(SigningKeyError) as error:
            load(path)
        assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_the_public_key_is_not_accepted_as_the_private_one(keys):
    with pytest.raises(SigningKeyError, match="not an unencrypted PEM private key"):
        load_signer(keys / PUBLIC_KEY_NAME)


# -- settings


def test_graph_sharing_settings_name_what_each_process_does(tmp_path):
    key, pub = str(tmp_path / "s.key"), str(tmp_path / "v.pub")
    cases = {
        (): "unconfigured",
        (("TUNECACHE_SIGNING_KEY", key),): "publish",
        (("TUNECACHE_VERIFY_KEY", pub),): "verify",
        (("TUNECACHE_SIGNING_KEY", key), ("TUNECACHE_MODE", "readonly")): "verify",
        (("TUNECACHE_SIGNING_KEY", key), ("TUNECACHE_SHARE", "-graphs")): "off",
        (("TUNECACHE_SIGNING_KEY", "  "),): "unconfigured",
    }
    for env, state in cases.items():
        plan = Settings.from_env(dict(env)).graph_sharing()
        assert plan.state == state, (env, plan)
    plan = Settings.from_env({}, signing_key=3).graph_sharing()
    assert plan.state == "invalid"
    assert plan.problem == "TUNECACHE_SIGNING_KEY=3 is invalid: expected a file path"


def test_a_bad_key_setting_leaves_the_tuning_settings_usable():
    settings = Settings.from_env({"TUNECACHE_LEASE_SECONDS": "40"}, verify_key=3)
    assert settings.lease_seconds == 40 and settings.graph_sharing().state == "invalid"


def test_signing_and_verify_keys_of_different_pairs_are_refused(keys, tmp_path):
    other = write_key_pair(tmp_path / "other")
    plan = Settings.from_env({}, signing_key=str(keys / PRIVATE_KEY_NAME),
                             verify_key=str(other.public_key)).graph_sharing()
    with pytest.raises(SigningKeyError, match="not the public half"):
        GraphShare.from_settings(plan, lambda: None)  # type: ignore[arg-type, return-value]


# -- the service over the real store


def test_published_graph_loads_on_another_process_handle(db_url, keys):
    publisher, cache = _share(db_url, keys)
    data = os.urandom(1000) + b"compiled graph " * 10_000
    assert publisher.publish("fxgraph", "key-1", data, "2.13.0") is True
    consumer, cache2 = _share(db_url, keys, publish=False)
    assert consumer.load("fxgraph", "key-1") == data
    assert consumer.load("autograd", "key-1") is None
    stored = ArtifactStore(cache.database()).get("fxgraph", "key-1")
    assert len(stored.payload) < len(data) / 3, "stored compressed"
    assert consumer.counts == {"loaded": 1, "absent": 1}
    cache.close()
    cache2.close()


def test_a_consumer_with_the_public_key_only_publishes_nothing(db_url, keys):
    consumer, cache = _share(db_url, keys, publish=False)
    assert not consumer.publishes
    assert consumer.publish("fxgraph", "k", b"graph", "2.13.0") is False
    assert cache.database().run(
        lambda c: c.execute(artifacts.select()).all()) == []
    cache.close()


def test_second_publish_of_a_key_keeps_the_first(db_url, keys):
    # The entry there verifies: it is never replaced, whatever the second publisher has.
    first, cache = _share(db_url, keys)
    second, cache2 = _share(db_url, keys)
    assert first.publish("fxgraph", "k", b"first", "2.13.0") is True
    assert second.publish("fxgraph", "k", b"second", "2.13.0") is False
    assert second.counts == {"present": 1}
    assert second.load("fxgraph", "k") == b"first"
    cache.close()
    cache2.close()


def _tamper(url: str, keys: Path, tmp_path: Path, how: str) -> None:
    """Damage the published entry fxgraph/k the way an attacker with write access to
    the database would (through the store, so the row stays self-consistent)."""
    cache = tunecache.open(url)
    store = ArtifactStore(cache.database())
    good = store.get("fxgraph", "k")
    payload, signature = good.payload, good.signature
    if how == "unsigned":
        signature = b""
    elif how == "signature replaced":
        signature = os.urandom(64)
    elif how == "payload replaced":
        payload = zlib.compress(b"evil")
    elif how == "other key pair":
        payload = zlib.compress(b"evil")
        other = write_key_pair(tmp_path / "attacker")
        signature = load_signer(other.private_key).sign(
            "fxgraph", "k", hashlib.sha256(payload).hexdigest())
    elif how == "moved from another key":
        publisher, other_cache = _share(url, keys)
        publisher.publish("fxgraph", "other", b"evil", "2.13.0")
        other_cache.close()
        moved = store.get("fxgraph", "other")
        payload, signature = moved.payload, moved.signature
    cache.database().run(lambda c: c.execute(delete(artifacts).where(
        artifacts.c.cache_key == "k")), write=True)
    if how == "unsigned":
        store.put("fxgraph", "k", payload, b"x", "2.13.0")
        cache.database().run(lambda c: c.execute(update(artifacts).where(
            artifacts.c.cache_key == "k").values(signature=b"")), write=True)
    else:
        store.put("fxgraph", "k", payload, signature, "2.13.0")
    cache.close()


@pytest.mark.parametrize("how", ["unsigned", "signature replaced", "payload replaced",
                                 "other key pair", "moved from another key"])
def test_an_entry_that_does_not_verify_is_refused_with_one_warning(db_url, keys, tmp_path,
                                                                    how, caplog):
    publisher, cache = _share(db_url, keys)
    publisher.publish("fxgraph", "k", b"good graph", "2.13.0")
    cache.close()
    _tamper(db_url, keys, tmp_path, how)
    consumer, cache = _share(db_url, keys, publish=False)
    with caplog.at_level(logging.DEBUG, logger="tunecache"):
        assert consumer.load("fxgraph", "k") is None
        assert consumer.load("fxgraph", "k") is None  # the same reason again: debug only
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "fxgraph k" in warnings[0].getMessage()
    assert consumer.counts["refused"] == 2 and consumer.counts["loaded"] == 0
    cache.close()


def test_a_signed_entry_is_decompressed_only_after_it_verifies(sqlite_url, keys, tmp_path,
                                                              monkeypatch):
    publisher, cache = _share(sqlite_url, keys)
    publisher.publish("fxgraph", "k", b"good graph", "2.13.0")
    _tamper(sqlite_url, keys, tmp_path, "payload replaced")
    inflated: list[bytes] = []
    real = zlib.decompressobj

    def spy(*args, **kwargs):
        inflated.append(b"")
        return real(*args, **kwargs)

    monkeypatch.setattr(zlib, "decompressobj", spy)
    consumer, cache2 = _share(sqlite_url, keys, publish=False)
    assert consumer.load("fxgraph", "k") is None
    assert inflated == [], "decompressed before verifying"
    publisher.publish("fxgraph", "k2", b"good graph", "2.13.0")
    assert consumer.load("fxgraph", "k2") == b"good graph"
    assert inflated == [b""]  # the spy does see a verified entry's decompression
    cache.close()
    cache2.close()


def test_each_kind_of_artifact_has_its_own_bound_and_its_own_name_in_messages(
        sqlite_url, keys, monkeypatch, caplog):
    assert KernelShare.max_bytes < GraphShare.max_bytes
    monkeypatch.setattr(KernelShare, "max_bytes", 1000)
    graphs, cache = _share(sqlite_url, keys)
    plan = Settings.from_env({}, signing_key=str(keys / PRIVATE_KEY_NAME)).kernel_sharing()
    kernels = KernelShare.from_settings(plan, lambda: cache)
    big = os.urandom(2000)
    assert graphs.publish("fxgraph", "k", big, "2.13.0")
    assert kernels.publish("kernel", "KERNELKEY", big, "2.13.0")
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert graphs.load("fxgraph", "k") == big
        assert kernels.load("kernel", "KERNELKEY") is None  # over the kernels' bound
    assert kernels.counts["refused"] == 1 and graphs.counts["loaded"] == 1
    [warning] = [r.getMessage() for r in caplog.records]
    assert "compiled kernel KERNELKEY in the database is signed but does not decompress" \
        in warning and "Triton compiles it" in warning
    cache.close()


def test_an_unreachable_database_is_one_warning_and_no_graphs(keys, caplog):
    share, cache = _share("postgresql://nobody@127.0.0.1:9/none", keys, lock_timeout=1)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert share.load("fxgraph", "k") is None
        assert share.publish("fxgraph", "k", b"graph", "2.13.0") is False
        assert share.load("autograd", "k") is None
    assert len(caplog.records) == 1, caplog.text
    cache.close()


# -- an entry that does not verify is replaced by the next publisher


def _signature_of(url: str, key: str = "k") -> bytes:
    cache = tunecache.open(url)
    found = ArtifactStore(cache.database()).inspect("fxgraph", key)
    cache.close()
    return found.signature


def test_an_entry_signed_with_a_retired_key_is_replaced_by_the_next_publisher(
        db_url, keys, tmp_path, caplog):
    old_keys = tmp_path / "retired"
    write_key_pair(old_keys)
    old, cache = _share(db_url, old_keys)
    assert old.publish("fxgraph", "k", b"signed before the rotation", "2.12.0") is True
    assert old.publish("fxgraph", "k2", b"signed before the rotation", "2.12.0") is True
    cache.close()
    publisher, cache = _share(db_url, keys)
    with caplog.at_level(logging.DEBUG, logger="tunecache"):
        assert publisher.publish("fxgraph", "k", b"graph", "2.13.0") is True
        assert publisher.publish("fxgraph", "k2", b"graph 2", "2.13.0") is True
    assert publisher.counts == {"replaced": 2}
    replaced = [r for r in caplog.records if "replaced" in r.getMessage()]
    assert [r.levelno for r in replaced] == [logging.INFO, logging.DEBUG], caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    cache.close()
    reader, cache = _share(db_url, keys, publish=False)
    assert reader.load("fxgraph", "k") == b"graph"
    assert reader.load("fxgraph", "k2") == b"graph 2"
    assert reader.counts == {"loaded": 2}
    cache.close()


@pytest.mark.parametrize("how", ["unsigned", "signature replaced", "payload replaced",
                                 "other key pair", "moved from another key"])
def test_an_entry_that_does_not_verify_is_replaced_by_the_next_publisher(db_url, keys,
                                                                         tmp_path, how):
    publisher, cache = _share(db_url, keys)
    publisher.publish("fxgraph", "k", b"good graph", "2.13.0")
    cache.close()
    _tamper(db_url, keys, tmp_path, how)
    publisher, cache = _share(db_url, keys)
    assert publisher.publish("fxgraph", "k", b"recompiled graph", "2.13.0") is True
    assert publisher.counts == {"replaced": 1}
    cache.close()
    reader, cache = _share(db_url, keys, publish=False)
    assert reader.load("fxgraph", "k") == b"recompiled graph"
    cache.close()


@pytest.mark.parametrize("damage", ["missing", "truncated", "corrupted"])
def test_an_entry_whose_blob_is_damaged_is_replaced_by_the_next_publisher(sqlite_url, keys,
                                                                          damage):
    publisher, cache = _share(sqlite_url, keys)
    publisher.publish("fxgraph", "k", os.urandom(5000), "2.13.0")
    cache.close()
    [blob] = [p for p in Path(sqlite_url.removeprefix("sqlite:///") + ".blobs").glob("??/*")
              if len(p.name) == 64]
    if damage == "missing":
        blob.unlink()
    elif damage == "truncated":
        blob.write_bytes(blob.read_bytes()[:-1])
    else:
        data = bytearray(blob.read_bytes())
        data[10] ^= 1
        blob.write_bytes(bytes(data))
    publisher, cache = _share(sqlite_url, keys)
    # Another compile of the graph: other bytes (random here), so another digest.
    assert publisher.publish("fxgraph", "k", b"recompiled graph", "2.13.0") is True
    assert publisher.counts == {"replaced": 1}
    cache.close()
    reader, cache = _share(sqlite_url, keys, publish=False)
    assert reader.load("fxgraph", "k") == b"recompiled graph"
    cache.close()
    assert not blob.exists(), "the damaged blob is no row's: deleted"


def test_an_entry_whose_postgresql_payload_is_damaged_is_replaced(pg_url, keys):
    publisher, cache = _share(pg_url, keys)
    publisher.publish("fxgraph", "k", b"good graph", "2.13.0")
    cache.database().run(lambda c: c.execute(update(artifacts).values(
        payload=b"damaged")), write=True)
    cache.close()
    publisher, cache = _share(pg_url, keys)
    assert publisher.publish("fxgraph", "k", b"recompiled graph", "2.13.0") is True
    cache.close()
    reader, cache = _share(pg_url, keys, publish=False)
    assert reader.load("fxgraph", "k") == b"recompiled graph"
    cache.close()


def test_a_consumer_never_replaces_an_entry_that_does_not_verify(db_url, keys, tmp_path):
    publisher, cache = _share(db_url, keys)
    publisher.publish("fxgraph", "k", b"good graph", "2.13.0")
    cache.close()
    _tamper(db_url, keys, tmp_path, "other key pair")
    planted = _signature_of(db_url)
    consumer, cache = _share(db_url, keys, publish=False)
    assert consumer.load("fxgraph", "k") is None
    assert consumer.publish("fxgraph", "k", b"recompiled graph", "2.13.0") is False
    assert consumer.counts == {"refused": 1}
    cache.close()
    assert _signature_of(db_url) == planted


def _republish(url: str, keys: str, barrier, queue) -> None:
    publisher, cache = _share(url, Path(keys))
    data = os.urandom(200_000)  # each job's compile of the graph: its own bytes
    barrier.wait()
    won = publisher.publish("fxgraph", "k", data, "2.13.0")
    queue.put({"won": won, "counts": dict(publisher.counts),
               "mine": hashlib.sha256(data).hexdigest()})
    cache.close()


def test_of_five_jobs_publishing_over_one_bad_entry_at_once_one_replaces_it(db_url, keys,
                                                                           tmp_path):
    import multiprocessing
    from queue import Empty

    publisher, cache = _share(db_url, keys)
    publisher.publish("fxgraph", "k", b"good graph", "2.13.0")
    cache.close()
    _tamper(db_url, keys, tmp_path, "other key pair")
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(5), ctx.Queue()
    workers = [ctx.Process(target=_republish, args=(db_url, str(keys), barrier, queue))
               for _ in range(5)]
    for w in workers:
        w.start()
    out = []
    while len(out) < 5:
        try:
            out.append(queue.get(timeout=1))
        except Empty:
            died = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            assert not died, f"a worker died before reporting (exit codes {died})"
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    winners = [o for o in out if o["won"]]
    assert len(winners) == 1, out
    assert winners[0]["counts"] == {"replaced": 1}
    assert [o["counts"] for o in out if not o["won"]] == [{"present": 1}] * 4, out
    reader, cache = _share(db_url, keys, publish=False)
    data = reader.load("fxgraph", "k")
    assert hashlib.sha256(data).hexdigest() == winners[0]["mine"]
    assert len(cache.database().run(lambda c: c.execute(artifacts.select()).all())) == 1
    cache.close()
