"""What PyTorch's own tests (tools/pytorch_tests.py) found to differ with tunecache, each
reproduced in a real job: ``TUNECACHE_DB`` a real SQLite file, tunecache activating itself
through its torch.backends entry point, in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]

_IMPORT_ONLY = r"""
import json, sys
from unittest import mock

import torch
import torch._inductor.select_algorithm as select_algorithm
from torch._inductor.codecache import CacheBase

import tunecache.inductor.state as state

hooked = state.REGISTRY.hooks is not None and "lookup" in vars(
    select_algorithm.AlgorithmSelectorCache)
created = select_algorithm._ALGORITHM_SELECTOR_CACHE is not None
# test_codecache.py's TestCacheKeyStrategy: the system info follows what the job patched
# before its first compile (here: no Triton).
CacheBase.get_system.cache_clear()
with mock.patch("torch._inductor.runtime.triton_compat.HAS_TRITON", False):
    triton = CacheBase.get_system()["version"]["triton"]
CacheBase.get_system.cache_clear()
print(json.dumps({"hooked": hooked, "created": created, "triton": triton}))
"""


_AUTOGRAD_CACHE_OFF = r"""
import json

import torch
import torch._inductor.select_algorithm  # noqa: F401 - tunecache's parts are on from here
from torch._functorch import config as functorch_config
from torch._inductor import config
from torch._inductor.utils import fresh_cache

# test_codecache.py's test_cache_hot_load_pgo: the AOTAutograd cache (and the FX graph
# remote cache) turned off by the job.
with functorch_config.patch({"enable_autograd_cache": False}), config.patch(
        {"fx_graph_cache": True, "fx_graph_remote_cache": False}), fresh_cache():
    f = torch.compile(lambda x: x * 2, backend="inductor", fullgraph=True)
    f(torch.randn(2, 3))
    f(torch.randn(2, 4))
artifacts = torch.compiler.save_cache_artifacts()
info = artifacts[1] if artifacts else None
print(json.dumps({
    "remote_flag": functorch_config.enable_remote_autograd_cache,
    "inductor": len(info.inductor_artifacts) if info else 0,
    "aot_autograd": len(info.aot_autograd_artifacts) if info else 0}))
"""


def _job(tmp: Path, script: str, key: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    env.update(TUNECACHE_DB=str(tmp / "tune.db"), TORCHINDUCTOR_CACHE_DIR=str(tmp / "ind"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])))
    if key:
        from tunecache.core.signing import PRIVATE_KEY_NAME, write_key_pair

        write_key_pair(tmp / "keys")
        env["TUNECACHE_SIGNING_KEY"] = str(tmp / "keys" / PRIVATE_KEY_NAME)
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=str(tmp),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_enabling_the_gemm_hooks_creates_no_algorithm_selector(tmp_path):
    """Importing select_algorithm installs the GEMM hooks (on the class) without creating
    Inductor's AlgorithmSelectorCache: creating it ran CacheBase.get_system() and cached
    triton_key() at import, so test_codecache.py's TestCacheKeyStrategy tests, which patch
    HAS_TRITON and then read the system info, saw Triton's key with tunecache only."""
    seen = _job(tmp_path, _IMPORT_ONLY)
    assert seen["hooked"]
    assert not seen["created"]
    assert seen["triton"] is None


def test_a_job_that_turned_the_autograd_cache_off_records_no_autograd_artifacts(tmp_path):
    """With a signing key tunecache turns the remote AOTAutograd cache on (its flag is
    part of the AOTAutograd key, so it stays True); yet where the job turned the
    AOTAutograd cache off, torch must not go through AOTAutogradCache on tunecache's
    account: it recorded the entries for save_cache_artifacts() with tunecache only."""
    seen = _job(tmp_path, _AUTOGRAD_CACHE_OFF, key=True)
    assert seen["remote_flag"] is True
    assert seen["inductor"] == 2
    assert seen["aot_autograd"] == 0
