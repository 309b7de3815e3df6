"""Dynamo's shape profiles (profile-guided automatic dynamic shapes) shared through the
database, signed and verified, with real jobs.

Each job is a real process (tests/pgo_worker.py), activated by TUNECACHE_* alone, that
compiles a function at a few input sizes; a job with a fresh TORCHINDUCTOR_CACHE_DIR is a
new node (Dynamo's local profile lives under it). Jobs of one model share
TORCH_COMPILE_JOB_ID. A job that saw a size change publishes the profile that says so; a
new node with TUNECACHE_PGO=1 compiles that dimension dynamic at first sight, once. A
profile that does not verify carries a pickle that creates a directory when unpickled:
it must never be.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run, run_json
from sqlalchemy import select

torch = pytest.importorskip("torch")

import tunecache  # noqa: E402
from tunecache.core.pgo import MAX_PROFILE_BYTES, ProfileShare  # noqa: E402
from tunecache.core.signing import PRIVATE_KEY_NAME, PUBLIC_KEY_NAME, write_key_pair  # noqa: E402
from tunecache.inductor.graphs import encode_entry  # noqa: E402
from tunecache.inductor.pgo import KIND, stored_key  # noqa: E402
from tunecache.settings import Settings  # noqa: E402
from tunecache.store import ArtifactStore, Database  # noqa: E402
from tunecache.store.schema import artifacts  # noqa: E402

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
JOB_ID = "llama-pretrain"
# Dynamo's key for a job outside a process group (rank None) with no cache-key tag.
KEY = stored_key(f"{JOB_ID}:None:")


def _start(tmp: Path, name: str, db: str, sizes: str, y_sizes: str = "",
           job_id: str | None = JOB_ID, **extra: str) -> tuple[subprocess.Popen, Path, Path]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_", "TORCH_COMPILE_",
                                "TORCH_DYNAMO_"))}
    cache_dir = tmp / f"inductor-{name}"
    cache_dir.mkdir(parents=True)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(cache_dir),
        TUNECACHE_DB=db,
        TUNECACHE_SHARE="-graphs",  # profiles only: a graph loaded or not changes nothing here
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    if job_id is not None:
        env["TORCH_COMPILE_JOB_ID"] = job_id
    env.update(extra)
    out, log = tmp / f"{name}.json", tmp / f"{name}.log"
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "pgo_worker.py"), "--out", str(out), "--log", str(log),
         "--sizes", sizes, "--y-sizes", y_sizes],
        env=env, cwd=str(tmp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    return proc, out, log


def _finish(started: tuple[subprocess.Popen, Path, Path]) -> dict[str, Any]:
    proc, out, log = started
    try:
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output[-6000:]
    result = json.loads(out.read_text())
    result["log"] = log.read_text().splitlines()
    return result


def _job(tmp: Path, name: str, db: str, sizes: str, y_sizes: str = "",
         job_id: str | None = JOB_ID, **extra: str) -> dict[str, Any]:
    return _finish(_start(tmp, name, db, sizes, y_sizes, job_id, **extra))


def _warnings(job: dict[str, Any]) -> list[str]:
    return [line for line in job["log"] if line.startswith(("WARNING", "ERROR"))]


def _profiles(url: str) -> list[tuple[str, str]]:
    """(key, digest) of every stored shape profile."""
    with tunecache.open(url) as cache:
        db = cache.database()
        rows = db.run(lambda c: c.execute(select(artifacts.c.cache_key, artifacts.c.digest)
                                          .where(artifacts.c.kind == KIND)).all())
    return sorted((r.cache_key, r.digest) for r in rows)


def _share(url: str, key_file: Path) -> tuple[ProfileShare, tunecache.TuneCache]:
    cache = tunecache.open(url)
    plan = Settings.from_env({}, signing_key=str(key_file)).pgo_sharing()
    return ProfileShare.from_settings(plan, lambda: cache), cache


def _publish(url: str, key_file: Path, pickled: bytes) -> None:
    """Publish ``pickled`` as Dynamo's profile of JOB_ID, as a job would, signed with
    ``key_file``."""
    share, cache = _share(url, key_file)
    try:
        frame = encode_entry({"data": base64.b64encode(pickled).decode("ascii")})
        assert frame is not None and share.publish(KIND, KEY, frame, torch.__version__)
    finally:
        cache.close()


class _Marker:
    """Unpickling it creates a directory: the proof that a pickle was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return os.mkdir, (str(self.path),)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("keys") / "pair"
    write_key_pair(folder)
    return folder


def _assert_published_a_changed_dimension(job: dict[str, Any], url: str) -> None:
    # Static at the first size, dynamic once the size changed: two graphs; the profile is
    # published after the first compile and rewritten after the second.
    assert job["dynamic"] == [False, True] and job["unique_graphs"] == 2, job
    assert job["pgo"] == {"absent": 1, "published": 1, "rewritten": 1}, job
    assert [key for key, _ in _profiles(url)] == [KEY]


@pytest.fixture(scope="module")
def published(tmp_path_factory, keys) -> tuple[Path, dict[str, Any], bytes]:
    """A SQLite database (with its blob files) in which a job that saw its input's first
    dimension change published its profile; that job's result; and the profile's pickle
    as Dynamo wrote it to its local file (its own bytes, whatever tunecache did). Tests
    copy the database before they change anything."""
    tmp = tmp_path_factory.mktemp("published")
    (tmp / "db").mkdir()
    url = f"sqlite:///{tmp / 'db' / 'tune.db'}"
    job = _job(tmp, "publisher", url, "4,8", TUNECACHE_SHARE="+profiles",
               TUNECACHE_SIGNING_KEY=str(keys / PRIVATE_KEY_NAME))
    local = list((tmp / "inductor-publisher" / "dynamo").glob("code_state_*.pkl"))
    assert len(local) == 1, local
    return tmp / "db", job, local[0].read_bytes()


def _copy(published: tuple[Path, dict[str, Any], bytes], tmp: Path) -> str:
    shutil.copytree(published[0], tmp / "db")
    return f"sqlite:///{tmp / 'db' / 'tune.db'}"


# -- sharing


def test_a_new_node_compiles_a_dimension_that_changed_elsewhere_dynamic_at_once_on_sqlite(
        published, keys, tmp_path):
    """Without the profile (TUNECACHE_PGO=0, the same database, job id and key) a new
    node compiles static first, as Dynamo does on its own."""
    url = _copy(published, tmp_path)
    _assert_published_a_changed_dimension(published[1], url)
    assert _warnings(published[1]) == []
    signing = {"TUNECACHE_SIGNING_KEY": str(keys / PRIVATE_KEY_NAME)}
    started = [_start(tmp_path, "new-node", url, "12,16", TUNECACHE_SHARE="+profiles", **signing),
               _start(tmp_path, "without", url, "12", TUNECACHE_SHARE="-profiles", **signing)]
    job, without = (_finish(s) for s in started)
    # One graph, dynamic from the start, and no recompile at a fourth size.
    assert job["dynamic"] == [True] and job["unique_graphs"] == 1, job
    assert job["pgo"] == {"loaded": 1}, job
    assert job["remote"]["TuneCacheDynamoPGOCache"]["hit"] == 1, job
    assert _warnings(job) == []
    assert without["dynamic"] == [False], without
    assert without["pgo"] is None and without["remote_pgo"] is None, without


def test_a_new_node_compiles_a_dimension_that_changed_elsewhere_dynamic_at_once_on_postgresql(
        pg_url, keys, tmp_path):
    pgo = {"TUNECACHE_SHARE": "+profiles", "TUNECACHE_SIGNING_KEY": str(keys / PRIVATE_KEY_NAME)}
    first = _job(tmp_path, "publisher", pg_url, "4,8", **pgo)
    _assert_published_a_changed_dimension(first, pg_url)
    job = _job(tmp_path, "new-node", pg_url, "12,16", **pgo)
    assert job["dynamic"] == [True] and job["unique_graphs"] == 1, job
    assert job["pgo"] == {"loaded": 1}, job
    assert _warnings(first) == _warnings(job) == []


def test_a_job_without_a_job_id_is_told_so_and_shares_no_profile(sqlite_url, keys, tmp_path):
    """Dynamo keys profiles by job id: without one it reads and writes none, local or
    shared, and compiles static first; one info line says what to set."""
    job = _job(tmp_path, "no-id", sqlite_url, "4,8", job_id=None, TUNECACHE_SHARE="+profiles",
               TUNECACHE_SIGNING_KEY=str(keys / PRIVATE_KEY_NAME))
    assert job["dynamic"] == [False, True], job
    assert job["remote_pgo"] is True and not job["pgo"], job
    assert [line for line in job["log"] if "TORCH_COMPILE_JOB_ID" in line] == [
        "INFO tunecache: Dynamo keys its shape profiles by job id, and this job has none: set "
        "TORCH_COMPILE_JOB_ID (one value for every job of a model) to share them"]
    assert not (tmp_path / "inductor-no-id" / "dynamo").exists()


# -- trust


@pytest.mark.parametrize("url_kind,how", [("sqlite", "altered"), ("postgresql", "other key")])
def test_a_profile_that_does_not_verify_is_never_unpickled_and_costs_one_warning(
        published, keys, tmp_path, request, url_kind, how):
    """The job then compiles as Dynamo does without a profile (static first)."""
    url = request.getfixturevalue("sqlite_url" if url_kind == "sqlite" else "pg_url")
    marker = tmp_path / "unpickled"
    evil = pickle.dumps(_Marker(marker))
    if how == "altered":
        # The cluster's signature over Dynamo's real profile, the bytes then swapped for
        # another pickle (the digest column follows them: only the signature can tell).
        _publish(url, keys / PRIVATE_KEY_NAME, published[2])
        store = ArtifactStore(Database(url))
        found, digest, signature = store.examine(KIND, KEY)
        assert found is not None and not isinstance(found, str)
        frame = encode_entry({"data": base64.b64encode(evil).decode("ascii")})
        assert frame is not None
        assert store.replace(KIND, KEY, digest, signature, zlib.compress(frame), signature,
                             torch.__version__)
        store.db.dispose()
    else:
        other = tmp_path / "other-keys"
        write_key_pair(other)
        _publish(url, other / PRIVATE_KEY_NAME, evil)
    job = _job(tmp_path, "job", url, "12", TUNECACHE_SHARE="+profiles",
               TUNECACHE_SIGNING_KEY=str(keys / PRIVATE_KEY_NAME))
    assert not marker.exists()
    assert job["dynamic"] == [False], job
    warnings = _warnings(job)
    assert len(warnings) == 1 and "shape profile" in warnings[0] \
        and "does not verify" in warnings[0], job["log"]
    assert job["pgo"]["refused"] == 1, job


def test_an_oversized_profile_is_refused_before_it_is_read(db_url, keys, caplog):
    """A row that claims more than a profile's bound is refused on its size alone, with
    one warning: none of its bytes are read, let alone decompressed or unpickled."""
    url = db_url
    _publish(url, keys / PRIVATE_KEY_NAME, b"x" * 100)
    store = ArtifactStore(Database(url))
    _, digest, signature = store.examine(KIND, KEY)
    huge = os.urandom(MAX_PROFILE_BYTES + 1)  # incompressible: stored as large as it is
    assert store.replace(KIND, KEY, digest, signature, huge, signature, torch.__version__)
    store.db.dispose()
    if url.startswith("sqlite"):
        # Its blob file goes: a read of it would be another warning, were it attempted.
        for blob in Path(url.removeprefix("sqlite:///") + ".blobs").glob("??/*"):
            blob.unlink()
    share, cache = _share(url, keys / PRIVATE_KEY_NAME)
    try:
        with caplog.at_level("WARNING", logger="tunecache"):
            assert share.load(KIND, KEY) is None
    finally:
        cache.close()
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 1 and f"more than {MAX_PROFILE_BYTES} for a pgo" in lines[0], lines


@pytest.mark.parametrize("url_kind,readonly", [
    ("sqlite", {"TUNECACHE_VERIFY_KEY": PUBLIC_KEY_NAME}),
    ("postgresql", {"TUNECACHE_SIGNING_KEY": PRIVATE_KEY_NAME, "TUNECACHE_MODE": "readonly"}),
], ids=["verify-key", "readonly-mode"])
def test_a_readonly_job_loads_the_profile_and_publishes_nothing(published, keys, tmp_path,
                                                                request, url_kind, readonly):
    """The job learns something new (its second input's size changes too), which a
    publisher would write back; a consumer writes nothing."""
    url = request.getfixturevalue("sqlite_url" if url_kind == "sqlite" else "pg_url")
    _publish(url, keys / PRIVATE_KEY_NAME, published[2])
    before = _profiles(url)
    env = {name: str(keys / value) if name.endswith("_KEY") else value
           for name, value in readonly.items()}
    job = _job(tmp_path, "consumer", url, "12,16", "5,7", TUNECACHE_SHARE="+profiles", **env)
    # x dynamic at first sight (loaded), then y's change compiles a second graph.
    assert job["dynamic"] == [True, True] and job["unique_graphs"] == 2, job
    assert job["publishes"] is False and job["pgo"] == {"loaded": 1}, job
    assert _profiles(url) == before
    assert _warnings(job) == []


# -- settings and operator commands


def test_profiles_are_shared_by_default_with_a_key_whether_graphs_are_or_not(tmp_path):
    key = str(tmp_path / "k")
    assert Settings.from_env({"TUNECACHE_SIGNING_KEY": key}).pgo_sharing().state == "publish"
    off = Settings.from_env({"TUNECACHE_SIGNING_KEY": key, "TUNECACHE_SHARE": "-profiles"})
    assert off.pgo_sharing().state == "off" and off.graph_sharing().state == "publish"
    assert Settings.from_env({}).pgo_sharing().state == "unconfigured"
    assert Settings.from_env({"TUNECACHE_VERIFY_KEY": key,
                              "TUNECACHE_SHARE": "-graphs"}).pgo_sharing().state == "verify"


def test_operator_commands_count_list_prune_and_export_shape_profiles(db_url, keys, tmp_path):
    _publish(db_url, keys / PRIVATE_KEY_NAME, b"profile" * 50)
    stats = run_json("stats", "--db", db_url)["graphs"]
    assert [(r["kind"], r["count"]) for r in stats["by_kind"]] == [("pgo", 1)]
    assert [r["key"] for r in run_json("ls", "--db", db_url, "--kind", "pgo")] == [KEY]
    exported = tmp_path / "out.jsonl"
    assert run("export", "--db", db_url, "-o", str(exported)).exit_code == 0
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert run("import", "--db", other, str(exported)).exit_code == 0
    assert [r["key"] for r in run_json("ls", "--db", other, "--graphs")] == [KEY]
    dry = run_json("prune", "--db", db_url, "--kind", "pgo", "--dry-run")
    assert dry["graphs"]["would_delete"] == 1
    assert run_json("prune", "--db", db_url, "--kind", "pgo")["graphs"]["deleted"] == 1
    assert run_json("ls", "--db", db_url, "--kind", "pgo") == []


def test_doctor_says_whether_jobs_share_shape_profiles(sqlite_url, keys, monkeypatch):
    for var in ("TUNECACHE_SIGNING_KEY", "TUNECACHE_VERIFY_KEY", "TUNECACHE_SHARE"):
        monkeypatch.delenv(var, raising=False)

    def check() -> tuple[int, dict[str, Any]]:
        done = run("doctor", "--db", sqlite_url, "--json")
        return done.exit_code, {c["name"]: c for c in json.loads(done.stdout)["checks"]}["pgo"]

    assert check()[1]["message"].startswith("shape profiles not shared: no key set")
    monkeypatch.setenv("TUNECACHE_SHARE", "-profiles")
    assert check()[1]["message"] == ("shape profiles not shared (TUNECACHE_SHARE without "
                                     "profiles)")
    monkeypatch.setenv("TUNECACHE_SHARE", "+profiles")
    monkeypatch.setenv("TUNECACHE_VERIFY_KEY", str(keys / PUBLIC_KEY_NAME))
    _, pgo = check()
    assert pgo["status"] == "ok" and pgo["message"].startswith(
        "load (publish none) Dynamo's shape profiles"), pgo
