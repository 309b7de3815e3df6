"""A user's remote-cache setting is never overridden.

tunecache turns on torch's remote FX graph, autotune and shape-profile caches
(tunecache.parts.REMOTE_FLAGS) only where the user left them unset, and answers whether
the remote AOTAutograd cache is on while its flag is unset; an explicit
``=0`` is kept, said once, and reported by ``tunecache doctor``. AOTAutograd entries are
served and published only while the FX graph remote cache is on. Real jobs
(tests/graph_share_worker.py: a training step under max-autotune) with a signing key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

torch = pytest.importorskip("torch")

from cli_helpers import run  # noqa: E402

import tunecache  # noqa: E402
from tunecache.core.signing import PRIVATE_KEY_NAME, write_key_pair  # noqa: E402
from tunecache.store.schema import artifacts  # noqa: E402

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

FLAGS = {"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "fx_graph_remote_cache",
         "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "enable_remote_autograd_cache",
         "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "autotune_remote_cache",
         "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO": "automatic_dynamic_remote_pgo"}


def _job(tmp: Path, name: str, **extra: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_", "TORCH_DYNAMO_"))}
    cache_dir = tmp / f"inductor-{name}"
    cache_dir.mkdir(parents=True)
    write_key_pair(tmp / "keys")
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache_dir), TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               TORCHINDUCTOR_AUTOGRAD_CACHE="1", TUNECACHE_DB=str(tmp / "tune.db"),
               TUNECACHE_SIGNING_KEY=str(tmp / "keys" / PRIVATE_KEY_NAME),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), str(TESTS),
                                                        os.environ.get("PYTHONPATH")])))
    env.update(extra)
    out, log = tmp / f"{name}.json", tmp / f"{name}.log"
    done = subprocess.run([sys.executable, str(TESTS / "graph_share_worker.py"), "--out",
                           str(out), "--log", str(log)], env=env, cwd=str(tmp),
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-6000:]
    result = json.loads(out.read_text())
    result["log"] = log.read_text().splitlines()
    return result


def _kinds(tmp: Path) -> list[str]:
    if not (tmp / "tune.db").exists():
        return []
    with tunecache.open(str(tmp / "tune.db")) as cache:
        return sorted(cache.database().run(
            lambda c: c.execute(select(artifacts.c.kind)).scalars().all()))


@pytest.mark.parametrize("variable", [None, *FLAGS])
def test_a_remote_cache_flag_set_to_0_is_kept_and_said_once(tmp_path, variable):
    job = _job(tmp_path, "job", **({variable: "0"} if variable else {}))
    assert job["enabled"], job
    off = FLAGS.get(variable or "")
    # Only the flag the user turned off is off; tunecache turned every other one on, but
    # AOTAutograd's: its flag stays the user's (None), and tunecache answers torch's
    # should_use_remote_autograd_cache() itself (no use without the FX graph's cache).
    expected: dict[str, Any] = {"enable_remote_autograd_cache": None}
    if off:
        expected[off] = False
    assert {name: value for name, value in job["flags"].items() if value is not True} == (
        expected), job["flags"]
    assert job["remote_autograd"] is (off not in ("fx_graph_remote_cache",
                                                  "enable_remote_autograd_cache")), job
    said = [line for line in job["log"] if "tunecache keeps it" in line]
    assert len(said) == (1 if off else 0), job["log"]
    if off:
        assert variable in said[0], said
    kinds = _kinds(tmp_path)
    if off == "fx_graph_remote_cache":
        # No FX graph remote cache: no graph shared at all (AOTAutograd's needs it).
        assert kinds == [] and job["graphs"] is None and "graphs" not in job["parts"], job
    elif off == "enable_remote_autograd_cache":
        assert kinds == ["fxgraph", "fxgraph"], kinds
    else:
        assert kinds == ["autograd", "fxgraph", "fxgraph"], kinds
    if off == "autotune_remote_cache":
        assert "triton" not in job["parts"], job["parts"]


def test_aotautograd_entries_are_served_only_while_the_fx_graph_remote_cache_is_on(
        tmp_path):
    from torch._functorch import config as functorch_config
    from torch._inductor import config

    from tunecache.inductor.graphs import encode_entry, remote_cache_classes
    from tunecache.inductor.state import REGISTRY

    assert config.fx_graph_remote_cache is None  # as this test process's environment has it
    write_key_pair(tmp_path / "keys")
    assert tunecache.enable(db=str(tmp_path / "tune.db"),
                            signing_key=str(tmp_path / "keys" / PRIVATE_KEY_NAME))
    try:
        assert REGISTRY.graphs is not None and config.fx_graph_remote_cache is True
        autograd = remote_cache_classes()["RemoteAOTAutogradCache"]("test")
        value = {"data": "aGVsbG8=", "time_taken_ms": 1}
        with config.patch(fx_graph_remote_cache=False):
            autograd.put("k1", value)  # not published
        assert _kinds(tmp_path) == []
        autograd.put("k2", value)
        assert _kinds(tmp_path) == ["autograd"]
        assert autograd.get("k2") is None  # compiled here: Inductor's local cache has it
        # An entry another process published:
        REGISTRY.graphs.publish("autograd", "k3", encode_entry(value), torch.__version__)
        assert autograd.get("k3") is not None
        with config.patch(fx_graph_remote_cache=False):
            assert autograd.get("k3") is None
        with functorch_config.patch(enable_autograd_cache=False):
            assert autograd.get("k3") is None  # a cache turned off does not live on remotely
    finally:
        tunecache.disable()


def test_doctor_reports_remote_cache_flags_kept_off(sqlite_url, monkeypatch):
    for variable in FLAGS:
        monkeypatch.delenv(variable, raising=False)
    done = run("doctor", "--db", sqlite_url, "--json")
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["remote flags"]["status"] == "ok", checks["remote flags"]
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "0")
    monkeypatch.setenv("TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE", "0")
    done = run("doctor", "--db", sqlite_url, "--json")
    assert done.exit_code == 0, done.output
    check = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["remote flags"]
    assert check["status"] == "warn"
    assert "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=0 (so compiled graphs are not shared)" in (
        check["message"])
    assert "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=0" in check["message"]
    done = run("doctor", "--db", sqlite_url)
    assert "remote flags" in done.output and "never overrides a 0" in done.output


def test_a_remote_autograd_flag_the_user_sets_after_enable_is_torchs_answer(tmp_path):
    """test_codecache.py's test_log_event_autograd_remote: a job that turns the remote
    AOTAutograd cache on in code, with the local one off, after tunecache is on, gets a
    remote-only AOTAutograd cache, as without tunecache; while the flag is unset,
    tunecache keeps it off with the local cache off."""
    from torch._functorch import config as functorch_config
    from torch._functorch._aot_autograd import autograd_cache

    write_key_pair(tmp_path / "keys")
    with functorch_config.patch(enable_remote_autograd_cache=None):
        assert tunecache.enable(db=str(tmp_path / "tune.db"),
                                signing_key=str(tmp_path / "keys" / PRIVATE_KEY_NAME))
        try:
            with functorch_config.patch(enable_autograd_cache=False):
                assert autograd_cache.should_use_remote_autograd_cache() is False
                with functorch_config.patch(enable_remote_autograd_cache=True):
                    assert autograd_cache.should_use_remote_autograd_cache() is True
            with functorch_config.patch(enable_autograd_cache=True,
                                        enable_remote_autograd_cache=False):
                assert autograd_cache.should_use_remote_autograd_cache() is False
        finally:
            tunecache.disable()


def test_a_backend_override_patched_after_the_remote_cache_was_made_wins_while_it_lasts(
        tmp_path):
    """torch keeps one AOTAutograd remote cache per process; PyTorch's tests patch
    ``RemoteAOTAutogradCache.backend_override_cls`` (``mock_cache.PatchCaches``) and
    count what reaches their mock backend, also where tunecache's instance was made by
    an earlier compile (test_codecache.py's test_log_event_autograd_remote after
    TestFxGraphCacheHashing)."""
    from unittest import mock

    from torch._inductor import remote_cache

    from tunecache.inductor.graphs import remote_cache_classes

    class Theirs:
        def __init__(self) -> None:
            self.data: dict[str, Any] = {}

        def get(self, key: str) -> Any:
            return self.data.get(key)

        def put(self, key: str, data: Any) -> None:
            self.data[key] = data

    write_key_pair(tmp_path / "keys")
    assert tunecache.enable(db=str(tmp_path / "tune.db"),
                            signing_key=str(tmp_path / "keys" / PRIVATE_KEY_NAME))
    try:
        made_before = remote_cache_classes()["RemoteAOTAutogradCache"]("test")
        value = {"data": "aGVsbG8=", "time_taken_ms": 1}
        with mock.patch.object(remote_cache.RemoteAOTAutogradCache, "backend_override_cls",
                               Theirs):
            made_before.put("k", value)
            assert made_before.get("k") == value
            assert isinstance(made_before.backend, Theirs)
        assert _kinds(tmp_path) == []  # theirs took it, not the database
        assert made_before.get("k") is None  # ours again
    finally:
        tunecache.disable()
