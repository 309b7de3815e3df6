"""Compiled graphs shared through the database, signed and verified, with real jobs.

Each job is a real process (tests/graph_share_worker.py) that compiles a training step
with tunecache on and Inductor's FX graph and AOTAutograd caches on; a job with a fresh
TORCHINDUCTOR_CACHE_DIR is a new node. A job with the signing key publishes what it
compiles; a job on another node loads it from the database, and Inductor's own counters
say so. Entries that do not verify are refused before anything of them is unpickled:
the tampered entries below carry a pickle that creates a marker file when unpickled, and
the last test shows that the same payload, signed with the cluster's key, does reach
Inductor's unpickler and creates it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select, update

torch = pytest.importorskip("torch")

import tunecache  # noqa: E402
from tunecache.core.signing import PRIVATE_KEY_NAME, PUBLIC_KEY_NAME, load_signer, write_key_pair  # noqa: E402
from tunecache.inductor.graphs import decode_entry, encode_entry  # noqa: E402
from tunecache.inductor.state import REGISTRY  # noqa: E402
from tunecache.process import PROCESS  # noqa: E402
from tunecache.store import ArtifactStore  # noqa: E402
from tunecache.store.schema import artifacts  # noqa: E402

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _job(tmp: Path, name: str, db: str, *, widths: str = "64", autoload: bool = False,
         **extra: str) -> dict[str, Any]:
    """Run one job on a new node (a fresh Inductor cache directory); its result, with
    the lines it logged on the ``tunecache`` logger under "log". ``autoload``: activated
    by the environment alone, as in production, rather than by ``enable()``."""
    return _finish(_start(tmp, name, db, widths=widths, autoload=autoload, **extra))


def _start(tmp: Path, name: str, db: str, *, widths: str = "64", autoload: bool = False,
           **extra: str) -> tuple[subprocess.Popen, Path, Path]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    cache_dir = tmp / f"inductor-{name}"
    cache_dir.mkdir(parents=True)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(cache_dir),
        TORCHINDUCTOR_FX_GRAPH_CACHE="1",
        TORCHINDUCTOR_AUTOGRAD_CACHE="1",
        TUNECACHE_DB=db,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    env.update(extra)
    out, log = tmp / f"{name}.json", tmp / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "graph_share_worker.py"), "--out", str(out),
         "--log", str(log), "--widths", widths, *(["--autoload"] if autoload else [])],
        env=env, cwd=str(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    return proc, out, log


def _finish(started: tuple[subprocess.Popen, Path, Path]) -> dict[str, Any]:
    proc, out, log = started
    try:
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output[-6000:]
    result = json.loads(out.read_text())
    result["log"] = log.read_text().splitlines()
    assert result["enabled"], result
    return result


def _rows(url: str) -> set[tuple[str, str, str]]:
    """(kind, key, digest) of every stored graph."""
    with tunecache.open(url) as cache:
        db = cache.database()
        return {tuple(r) for r in db.run(lambda c: c.execute(select(
            artifacts.c.kind, artifacts.c.cache_key, artifacts.c.digest)).all())}


def _warnings(result: dict[str, Any]) -> list[str]:
    return [line for line in result["log"] if line.startswith(("WARNING", "ERROR"))]


def _assert_published_everything(job: dict[str, Any], url: str) -> None:
    assert job["publishes"] and job["graphs"] == {"absent": 3, "published": 3}, job
    assert job["inductor"].get("fxgraph_cache_bypass", 0) == 0, job
    assert job["aot_autograd"].get("autograd_cache_bypass", 0) == 0, job
    assert sorted(kind for kind, _, _ in _rows(url)) == ["autograd", "fxgraph", "fxgraph"]


def _assert_loaded_everything(job: dict[str, Any]) -> None:
    # A fresh Inductor cache directory: every hit is a remote one, from the database.
    assert job["inductor"].get("fxgraph_cache_hit", 0) == 2, job  # forward and backward
    assert job["inductor"].get("fxgraph_cache_miss", 0) == 0, job
    assert job["aot_autograd"].get("autograd_cache_hit", 0) == 1, job
    assert job["remote"]["TuneCacheAOTAutogradCache"]["hit"] == 1, job
    assert job["remote"]["TuneCacheFxGraphCache"]["hit"] == 2, job
    assert job["graphs"]["loaded"] == 3, job


def _assert_compiled_everything(job: dict[str, Any]) -> None:
    assert job["inductor"].get("fxgraph_cache_miss", 0) == 2, job
    assert job["inductor"].get("fxgraph_cache_hit", 0) == 0, job
    assert job["aot_autograd"].get("autograd_cache_miss", 0) == 1, job


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys") / "pair"
    write_key_pair(folder)
    return folder


@pytest.fixture(scope="module")
def published(tmp_path_factory, keys) -> tuple[Path, dict[str, Any]]:
    """A SQLite database (with its blob files) in which a job published its graphs, and
    that job's result. Tests copy it (:func:`_copy`) before they change anything."""
    tmp = tmp_path_factory.mktemp("published")
    url = f"sqlite:///{tmp / 'db' / 'tune.db'}"
    (tmp / "db").mkdir()
    job = _job(tmp, "publisher", url, TUNECACHE_SIGNING_KEY=str(keys / PRIVATE_KEY_NAME))
    _assert_published_everything(job, url)
    return tmp / "db", job


def _copy(published: tuple[Path, dict[str, Any]], tmp: Path) -> str:
    shutil.copytree(published[0], tmp / "db")
    return f"sqlite:///{tmp / 'db' / 'tune.db'}"


# -- sharing


def test_new_node_loads_the_graphs_another_node_published_on_sqlite(published, keys, tmp_path):
    url = _copy(published, tmp_path)
    job = _job(tmp_path, "new-node", url, TUNECACHE_SIGNING_KEY=str(keys / PRIVATE_KEY_NAME))
    _assert_loaded_everything(job)
    assert job["outputs"] == published[1]["outputs"]
    assert _warnings(job) == []


def test_new_node_loads_the_graphs_another_node_published_on_postgresql(pg_url, keys, tmp_path):
    """The new node is activated by TUNECACHE_* alone (the autoload hook enables
    tunecache in the middle of Inductor's imports: graph sharing must come up there too)."""
    signing = {"TUNECACHE_SIGNING_KEY": str(keys / PRIVATE_KEY_NAME)}
    first = _job(tmp_path, "publisher", pg_url, **signing)
    _assert_published_everything(first, pg_url)
    job = _job(tmp_path, "new-node", pg_url, autoload=True, **signing)
    _assert_loaded_everything(job)
    assert job["outputs"] == first["outputs"]
    assert _warnings(first) == _warnings(job) == []


def test_a_restart_whose_graphs_hit_locally_reads_nothing_from_the_database(keys, tmp_path):
    """A job restarted on the same node (same Inductor cache directory) loads its graphs
    from Inductor's local caches and never asks the database for one: no remote get, no
    graph bytes read (torch 2.13 on the CPU; a torch 2.11 restart on a GPU was profiled
    fetching them)."""
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    signing = {"TUNECACHE_SIGNING_KEY": str(keys / PRIVATE_KEY_NAME)}
    first = _job(tmp_path, "first", url, **signing)
    _assert_published_everything(first, url)
    again = _job(tmp_path, "again", url, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-first"),
                 **signing)
    assert again["inductor"].get("fxgraph_cache_hit", 0) == 2, again
    assert again["aot_autograd"].get("autograd_cache_hit", 0) == 1, again
    ours = {name: stats for name, stats in again["remote"].items() if "TuneCache" in name}
    assert all(s == {"hit": 0, "miss": 0, "put": 0, "exception": 0} for s in ours.values()), ours
    assert not again["graphs"], again["graphs"]  # nothing loaded, looked up or published
    assert again["outputs"] == first["outputs"]


def test_two_nodes_compiling_one_graph_at_once_publish_it_once(sqlite_url, keys, tmp_path):
    """Every (kind, key) is published by exactly one of them: the other finds it there
    (or loads it, if it arrives after), whatever the timing."""
    signing = {"TUNECACHE_SIGNING_KEY": str(keys / PRIVATE_KEY_NAME)}
    started = [_start(tmp_path, f"node-{i}", sqlite_url, **signing) for i in range(2)]
    jobs = [_finish(s) for s in started]
    assert sum(job["graphs"].get("published", 0) for job in jobs) == 3, jobs
    assert sorted(kind for kind, _, _ in _rows(sqlite_url)) == ["autograd", "fxgraph", "fxgraph"]
    assert jobs[0]["outputs"] == jobs[1]["outputs"]
    assert [_warnings(job) for job in jobs] == [[], []]


def test_readonly_consumer_loads_verified_graphs_and_publishes_none(published, keys, tmp_path):
    """A job with the public key only: the published graph (width 64) loads; the graph
    nobody published (width 80) is compiled here and not published."""
    url = _copy(published, tmp_path)
    before = _rows(url)
    job = _job(tmp_path, "consumer", url, widths="64,80",
               TUNECACHE_VERIFY_KEY=str(keys / PUBLIC_KEY_NAME))
    assert job["publishes"] is False
    assert job["inductor"].get("fxgraph_cache_hit", 0) == 2, job
    assert job["inductor"].get("fxgraph_cache_miss", 0) == 2, job
    assert job["aot_autograd"].get("autograd_cache_hit", 0) == 1, job
    assert job["graphs"] == {"loaded": 3, "absent": 3}, job
    assert job["outputs"][0] == published[1]["outputs"][0]
    assert _rows(url) == before
    assert _warnings(job) == []


def test_without_keys_one_info_line_says_how_and_no_graph_is_stored(tmp_path):
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    job = _job(tmp_path, "job", url)
    assert job["graphs"] is None
    assert not any(name.startswith("TuneCache") for name in job["remote"]), job
    hints = [line for line in job["log"] if "tunecache keygen" in line]
    assert len(hints) == 1, job["log"]
    assert hints[0].startswith("INFO ")
    for name in ("TUNECACHE_SIGNING_KEY", "TUNECACHE_VERIFY_KEY", "TUNECACHE_SHARE=-graphs"):
        assert name in hints[0]
    # Nothing in this CPU training step autotunes, and without a key no graph is shared:
    # the one warning is the job's at-exit line that it found nothing to share.
    (warning,) = _warnings(job)
    assert "found nothing to share" in warning and "TUNECACHE_SIGNING_KEY" in warning
    assert _rows(url) == set()


# -- trust


class _Marker:
    """Unpickling this creates ``path``: what a forged entry could run in every job."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.touch, (Path(self.path),))


def _evil_payload(marker: Path) -> bytes:
    """A graph entry as tunecache stores it, whose pickle creates ``marker``."""
    frame = encode_entry({"data": base64.b64encode(pickle.dumps(_Marker(marker))).decode(),
                          "time_taken_ms": 1})
    return zlib.compress(frame)


def _replace(store: ArtifactStore, kind: str, key: str, payload: bytes, signature: bytes) -> None:
    """Put a self-consistent row (digest and size of ``payload``) in place of (kind, key),
    as an attacker who can write the database would, through tunecache's own store."""
    store.db.run(lambda c: c.execute(delete(artifacts).where(
        artifacts.c.kind == kind, artifacts.c.cache_key == key)), write=True)
    store.put(kind, key, payload, signature or b"-", "2.13.0")
    if not signature:
        store.db.run(lambda c: c.execute(update(artifacts).where(
            artifacts.c.kind == kind, artifacts.c.cache_key == key).values(signature=b"")),
            write=True)


def _blob(url: str, digest: str) -> Path:
    return Path(url.removeprefix("sqlite:///") + ".blobs") / digest[:2] / digest


# Three tamperings per job, one per entry (the AOTAutograd entry and the two FX graph
# entries are each looked up, whatever the others hold). Expected warnings: the store's
# own for bytes that no longer match their row, ours once per reason.
SCENARIOS = {
    "damaged bytes": (("autograd", "flipped byte"), ("fxgraph", "truncated"),
                      ("fxgraph", "signature replaced")),
    "forged entries": (("autograd", "other key pair"), ("fxgraph", "unsigned"),
                       ("fxgraph", "moved from another key")),
}


def _tamper(url: str, keys: Path, tmp_path: Path, scenario: str) -> list[Path]:
    """Tamper with the three published entries as SCENARIOS[scenario] says; the marker
    files that unpickling each evil payload would create."""
    markers = [tmp_path / f"MARKER-{i}" for i in range(3)]
    right = load_signer(keys / PRIVATE_KEY_NAME)
    wrong = load_signer(write_key_pair(tmp_path / "attacker").private_key)
    rows = sorted(_rows(url))  # autograd first, then the two fxgraph entries
    with tunecache.open(url) as cache:
        store = ArtifactStore(cache.database())
        genuine = {(kind, key): store.get(kind, key) for kind, key, _ in rows}
        for (kind, key, _), (want_kind, how), marker in zip(rows, SCENARIOS[scenario], markers):
            assert kind == want_kind
            # One payload per entry (another marker): blobs are shared by content.
            evil = _evil_payload(marker)
            evil_digest = hashlib.sha256(evil).hexdigest()
            if how in ("flipped byte", "truncated"):
                # A validly signed evil entry whose bytes then change on disk.
                _replace(store, kind, key, evil, right.sign(kind, key, evil_digest))
                blob = _blob(url, evil_digest)
                data = blob.read_bytes()
                blob.write_bytes(data[:-7] if how == "truncated"
                                 else data[:50] + bytes([data[50] ^ 0x40]) + data[51:])
            elif how == "signature replaced":
                _replace(store, kind, key, evil, os.urandom(64))
            elif how == "other key pair":
                _replace(store, kind, key, evil, wrong.sign(kind, key, evil_digest))
            elif how == "unsigned":
                _replace(store, kind, key, evil, b"")
            elif how == "moved from another key":
                # The other FX graph's genuine entry, signature and all, under this key.
                (other,) = [k for k in genuine if k[0] == kind and k[1] != key]
                _replace(store, kind, key, genuine[other].payload, genuine[other].signature)
    return markers


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_tampered_graphs_are_refused_unpickled_and_the_job_compiles_as_usual(
        published, keys, tmp_path, scenario):
    url = _copy(published, tmp_path)
    markers = _tamper(url, keys, tmp_path, scenario)
    tampered = _rows(url)

    job = _job(tmp_path, "victim", url, TUNECACHE_VERIFY_KEY=str(keys / PUBLIC_KEY_NAME))
    assert not any(m.exists() for m in markers), "a tampered entry was unpickled"
    _assert_compiled_everything(job)
    assert job["outputs"] == published[1]["outputs"]
    assert job["graphs"].get("loaded", 0) == 0, job
    warnings = _warnings(job)
    if scenario == "damaged bytes":
        assert job["graphs"] == {"absent": 2, "refused": 1}, job
        # The store's one (two entries' blobs are damaged: it says so once), and ours.
        assert len(warnings) == 2, warnings
        assert sum("further unreadable entries" in w for w in warnings) == 1, warnings
        assert sum("does not verify" in w for w in warnings) == 1, warnings
    else:
        assert job["graphs"] == {"refused": 3}, job
        assert len(warnings) == 2, warnings  # does not verify (twice), not signed
        assert sum("does not verify" in w for w in warnings) == 1, warnings
        assert sum("is not signed" in w for w in warnings) == 1, warnings
    assert _rows(url) == tampered, "first publish wins: nothing was rewritten"


@pytest.mark.parametrize("scenario", ["key rotation", *sorted(SCENARIOS)])
def test_entries_that_do_not_verify_are_replaced_by_the_next_publishing_job(
        published, keys, tmp_path, scenario):
    """Refused entries would block their keys forever (first publish wins): the next job
    with the signing key compiles, replaces them with its own, and a new node loads
    those. "key rotation": the database's entries are signed with the retired key."""
    url = _copy(published, tmp_path)
    if scenario == "key rotation":
        keys = tmp_path / "rotated"
        write_key_pair(keys)
        markers: list[Path] = []
    else:
        markers = _tamper(url, keys, tmp_path, scenario)
    publisher = _job(tmp_path, "publisher", url,
                     TUNECACHE_SIGNING_KEY=str(keys / PRIVATE_KEY_NAME))
    assert not any(m.exists() for m in markers), "a tampered entry was unpickled"
    _assert_compiled_everything(publisher)
    assert publisher["graphs"].get("replaced", 0) == 3, publisher
    assert sum("replaced with this job's" in line for line in publisher["log"]) == 1, \
        publisher["log"]
    assert len(_rows(url)) == 3
    job = _job(tmp_path, "new-node", url, TUNECACHE_VERIFY_KEY=str(keys / PUBLIC_KEY_NAME))
    _assert_loaded_everything(job)
    assert job["outputs"] == published[1]["outputs"]
    assert _warnings(job) == []


def test_the_forged_payload_reaches_inductors_unpickler_once_signed_with_the_cluster_key(
        published, keys, tmp_path, monkeypatch):
    """The control of the test above: the payload it plants is live. Signed with the
    cluster's own key, our remote FX graph cache hands it to Inductor, whose unpickling
    (``pickle.loads(base64.b64decode(value["data"]))``, as in FxGraphCache) runs it."""
    from torch._inductor import remote_cache

    url = _copy(published, tmp_path)
    marker = tmp_path / "MARKER"
    evil = _evil_payload(marker)
    right = load_signer(keys / PRIVATE_KEY_NAME)
    monkeypatch.setattr(PROCESS, "explained", set())
    with tunecache.open(url) as cache:
        store = ArtifactStore(cache.database())
        _replace(store, "fxgraph", "planted", evil,
                 right.sign("fxgraph", "planted", hashlib.sha256(evil).hexdigest()))
    try:
        assert tunecache.enable(db=url, signing_key=str(keys / PRIVATE_KEY_NAME))
        value = remote_cache.RemoteFxGraphCache("fx-graph-v1").get("planted")
    finally:
        tunecache.disable()
    assert value is not None and not marker.exists()
    pickle.loads(base64.b64decode(value["data"]))
    assert marker.exists()


# -- settings that turn graph sharing off, in this process


@pytest.mark.parametrize("setting,message", [
    ({"signing_key": 3}, "TUNECACHE_SIGNING_KEY=3 is invalid"),
    ({"signing_key": "/nonexistent/tunecache-signing.key"}, "no such file"),
    ({"verify_key": "/nonexistent/tunecache-verify.pub"}, "no such file"),
])
def test_a_bad_graph_setting_is_one_warning_and_tuning_stays_on(sqlite_url, setting, message,
                                                                 caplog, monkeypatch):
    from torch._inductor import config, remote_cache

    monkeypatch.setattr(PROCESS, "explained", set())
    before = remote_cache.RemoteFxGraphCache, config.fx_graph_remote_cache
    with caplog.at_level(logging.INFO, logger="tunecache"):
        try:
            assert tunecache.enable(db=sqlite_url, **setting)
            assert tunecache.enable(db=sqlite_url, **setting)  # again: no second line
            assert tunecache.is_enabled() and REGISTRY.graphs is None
            assert (remote_cache.RemoteFxGraphCache, config.fx_graph_remote_cache) == before
        finally:
            tunecache.disable()
    lines = [r for r in caplog.records if "compiled graphs" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, caplog.text
    assert message in lines[0].getMessage() and "\n" not in lines[0].getMessage()
    # Shape profiles use the same keys: the one warning covers them too.
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == lines, caplog.text


def test_disable_puts_inductors_remote_graph_caches_back(sqlite_url, keys, monkeypatch):
    from torch._functorch import config as functorch_config
    from torch._functorch._aot_autograd import autograd_cache
    from torch._inductor import config, remote_cache

    monkeypatch.setattr(PROCESS, "explained", set())
    names = ("RemoteFxGraphCache", "RemoteAOTAutogradCache")
    before = ([getattr(remote_cache, n) for n in names], config.fx_graph_remote_cache,
              functorch_config.enable_remote_autograd_cache)
    try:
        assert tunecache.enable(db=sqlite_url, signing_key=str(keys / PRIVATE_KEY_NAME))
        assert [getattr(remote_cache, n).__name__ for n in names] == [
            "TuneCacheFxGraphCache", "TuneCacheAOTAutogradCache"]
        assert config.fx_graph_remote_cache is True
        # The AOTAutograd flag stays the user's (None): tunecache answers while it is.
        assert functorch_config.enable_remote_autograd_cache is None
        with functorch_config.patch(enable_autograd_cache=True):
            assert autograd_cache.should_use_remote_autograd_cache() is True
    finally:
        tunecache.disable()
    assert ([getattr(remote_cache, n) for n in names], config.fx_graph_remote_cache,
            functorch_config.enable_remote_autograd_cache) == before
    assert REGISTRY.graphs is None and len(PROCESS.ledger) == 0


def test_stored_entry_format_round_trips_inductors_value():
    value = {"data": base64.b64encode(b"\x80\x05pickle\nwith newlines\n").decode(),
             "time_taken_ms": 1234}
    assert decode_entry(encode_entry(value)) == value
    assert encode_entry({"data": "not base64!"}) is None
    assert encode_entry(["not", "a", "dict"]) is None
    assert decode_entry(b"no magic") is None
