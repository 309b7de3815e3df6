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


def _job(tmp: Path, script: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    env.update(TUNECACHE_DB=str(tmp / "tune.db"), TORCHINDUCTOR_CACHE_DIR=str(tmp / "ind"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])))
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

