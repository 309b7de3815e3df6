"""One owner of tunecache's state in a process (tunecache.process): one patch ledger, one
TuneCache in a job and in each of its compile workers whatever is on, the environment
read once on the autoload path, every patch given back by tunecache.disable(), and one
honest line for a bad setting."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tunecache
from tunecache.core.signing import PRIVATE_KEY_NAME, write_key_pair

HERE = Path(__file__).resolve().parent
COUNTING = HERE / "owner_counting"  # its sitecustomize counts, in every process


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TRITON_", "TORCHINDUCTOR_"))}
    env.update(TRITON_INTERPRET="1", TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
               TRITON_CACHE_DIR=str(tmp / "triton"), OWNER_COUNTS=str(tmp / "counts"),
               **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(COUNTING), str(HERE.parent),
                                                      env.get("PYTHONPATH")]))
    (tmp / "counts").mkdir(exist_ok=True)
    return env


def _counts(tmp: Path) -> dict[int, dict[str, Any]]:
    return {int(p.stem): json.loads(p.read_text()) for p in (tmp / "counts").glob("*.json")}


def test_a_job_with_every_part_on_holds_one_ledger_and_one_cache_in_each_process(tmp_path):
    write_key_pair(tmp_path / "keys")
    env = _env(tmp_path, TUNECACHE_DB=str(tmp_path / "tune.db"),
               TUNECACHE_SIGNING_KEY=str(tmp_path / "keys" / PRIVATE_KEY_NAME))
    out = tmp_path / "out.json"
    job = subprocess.Popen([sys.executable, str(HERE / "process_owner_worker.py"), str(out)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = job.communicate(timeout=600)
    assert job.returncode == 0, stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["correct"], report
    assert {"user_kernels", "triton", "gemm", "narrowing", "fusion", "graphs", "kernels",
            "profiles"} <= set(report["parts"]), report
    assert report["gemm_lookups"] >= 1 and report["user_kernels_tuned"] == 1, report
    counts = _counts(tmp_path)
    main = counts.pop(job.pid)
    assert main["ledgers"] - main["scoped_ledgers"] == 1, main
    assert main["tune_caches"] == 1, main
    assert main["settings_read"] == 1, main  # the autoload hook's one reading
    # Inductor's compile workers, where it started any; one that never imports what a
    # part hooks (the pool's launcher) holds none.
    for pid, worker in counts.items():
        assert worker["ledgers"] - worker["scoped_ledgers"] <= 1, (pid, worker)
        assert worker["tune_caches"] <= 1, (pid, worker)


# What a compile worker does with every part on: it loads Triton kernels (their stored
# configs), fetches and publishes compiled kernels through Triton's cache manager, and
# tunes a user's autotuned kernel; each goes through the one cache.
_WORKER = """
import json, sys
import torch
from torch._inductor.runtime import triton_heuristics  # a worker's first import
import triton.runtime.autotuner
from tunecache import triton_cache
from tunecache.inductor.state import REGISTRY
from tunecache.switch import parts_on
info = json.dumps({"kernel": "k", "name": "triton_poi_fused_add_0", "device": "cpu"})
assert REGISTRY.triton.worker and REGISTRY.triton.get("inductor-key", info) is None
assert triton_cache.share() is not None
manager = triton_cache.KernelCacheManager("a" * 32)
assert manager.get_group("k.json") is None
from tunecache.user_kernels.autotuner import installed
assert installed().store_usable()
print(json.dumps(parts_on()))
"""


def test_a_compile_worker_with_every_part_on_opens_one_cache(tmp_path):
    write_key_pair(tmp_path / "keys")
    env = _env(tmp_path, TUNECACHE_DB=str(tmp_path / "tune.db"),
               TUNECACHE_SIGNING_KEY=str(tmp_path / "keys" / PRIVATE_KEY_NAME))
    done = subprocess.run([sys.executable, "-c", _WORKER], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(json.loads(done.stdout)) == {"user_kernels", "triton"}
    (worker,) = _counts(tmp_path).values()
    assert worker["ledgers"] - worker["scoped_ledgers"] == 1, worker
    assert worker["tune_caches"] == 1, worker
    assert worker["settings_read"] == 1, worker


def _patched_objects() -> list[Any]:
    """Everything a part of tunecache patches: the classes and modules whose attributes
    the ledger may set."""
    from torch._dynamo import config as dynamo_config
    from torch._functorch import config as functorch_config
    from torch._inductor import choices, config, remote_cache, scheduler, select_algorithm
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codegen import simd, triton, wrapper
    from torch._inductor.runtime import autotune_cache, coordinate_descent_tuner, triton_heuristics
    from triton.runtime.autotuner import Autotuner

    # The modules where torch asks whether the remote AOTAutograd cache is on (graph
    # sharing keeps it off while it does not serve it); those of this torch.
    autograd_cache_users = [
        module for name in ("torch._functorch._aot_autograd.autograd_cache",
                            "torch._functorch.aot_autograd",
                            "torch._functorch._aot_autograd.graph_compile")
        if callable(getattr(module := importlib.import_module(name),
                            "should_use_remote_autograd_cache", None))]
    return [*autograd_cache_users, Autotuner, select_algorithm.AlgorithmSelectorCache,
            select_algorithm.get_algorithm_selector_cache(), choices.InductorChoices,
            autotune_cache.AutotuneCache, triton_heuristics.CachingAutotuner,
            coordinate_descent_tuner.CoordescTuner, triton.TritonScheduling,
            simd.SIMDScheduling, wrapper.PythonWrapperCodegen, scheduler.Scheduler,
            AsyncCompile, remote_cache, config, functorch_config, dynamo_config]


def _own(owner: Any) -> dict[str, Any]:
    from tunecache.patching import _settings_object

    if _settings_object(owner):  # a config module: its settings, not its __dict__
        return dict(owner.get_config_copy())
    return dict(vars(owner))


def test_disable_gives_back_every_patched_object_tritons_autotuner_included(tmp_path,
                                                                            monkeypatch):
    from tunecache.process import PROCESS

    write_key_pair(tmp_path / "keys")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    owners = _patched_objects()
    before = [_own(o) for o in owners]
    manager = os.environ.get("TRITON_CACHE_MANAGER")
    # In the environment, as a job sets them: compiled kernels are shared only where the
    # compile workers, which read the environment, select the same database and key.
    monkeypatch.setenv("TUNECACHE_DB", str(tmp_path / "tune.db"))
    monkeypatch.setenv("TUNECACHE_SIGNING_KEY", str(tmp_path / "keys" / PRIVATE_KEY_NAME))
    assert tunecache.enable()
    try:
        on = set(tunecache.switch.parts_on())
        assert {"user_kernels", "triton", "gemm", "graphs", "kernels", "profiles"} <= on
        patched = PROCESS.ledger.entries()
        assert any(o is owners[0] for o, _ in patched), "Triton's Autotuner is patched"
        assert all(any(o is owner for owner in owners) for o, _ in patched), [
            (o, n) for o, n in patched if not any(o is owner for owner in owners)]
    finally:
        tunecache.disable()
    assert not tunecache.is_enabled() and len(PROCESS.ledger) == 0
    for owner, was in zip(owners, before):
        now = _own(owner)
        assert now.keys() == was.keys(), owner
        changed = [name for name in was if now[name] is not was[name] and now[name] != was[name]]
        assert not changed, (owner, changed)
    assert os.environ.get("TRITON_CACHE_MANAGER") == manager


@pytest.mark.parametrize("env", [{"TUNECACHE_DB": "mysql://x/y"}, {"TUNECACHE_MODE": "ro"}])
def test_a_bad_setting_is_one_line_naming_every_part_it_turns_off(tmp_path, env):
    from tunecache.switch import PARTS

    job_env = _env(tmp_path, **{"TUNECACHE_DB": str(tmp_path / "t.db"), **env})
    probe = ("import torch\nimport triton.runtime.autotuner\n"
             "from torch._inductor.runtime import triton_heuristics\n"
             "from torch._inductor import select_algorithm\n"
             "from tunecache.switch import parts_on\nprint(parts_on())\n")
    done = subprocess.run([sys.executable, "-c", probe], env=job_env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
    lines = [line for line in done.stderr.splitlines() if "tunecache" in line]
    assert len(lines) == 1, done.stderr
    (variable,) = env
    assert lines[0].startswith("tunecache is off in this job: ") and variable in lines[0]
    for part in PARTS:
        assert part.what in lines[0], (part.what, lines[0])
