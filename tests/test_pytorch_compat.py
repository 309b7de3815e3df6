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
    # (a torch without CUDA, such as 2.13's CPU wheel, reports no versions at all)
    triton = CacheBase.get_system().get("version", {}).get("triton")
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
    """With a signing key tunecache serves the remote AOTAutograd cache; yet where the
    job turned the AOTAutograd cache off, torch must not go through AOTAutogradCache on
    tunecache's account: it recorded the entries for save_cache_artifacts() with
    tunecache only."""
    seen = _job(tmp_path, _AUTOGRAD_CACHE_OFF, key=True)
    assert seen["remote_flag"] is None  # the user's, as they left it
    assert seen["inductor"] == 2
    assert seen["aot_autograd"] == 0


_OWN_GRAPH_AGAIN = r"""
import json

import torch
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.utils import fresh_cache

# test_codecache.py's TestFxGraphCacheHashing: each test compiles in a fresh local cache
# and counts one miss, although an earlier test of the process compiled the same graph.
def compile_once():
    torch._dynamo.reset()
    counters.clear()
    with config.patch(fx_graph_cache=True), fresh_cache():
        torch.compile(lambda x: x @ x, backend="inductor")(torch.randn(4, 4))
    return [counters["inductor"]["fxgraph_cache_miss"],
            counters["inductor"]["fxgraph_cache_hit"]]

print(json.dumps({"first": compile_once(), "again": compile_once()}))
"""


def test_a_graph_the_process_compiled_and_dropped_from_its_local_cache_is_compiled_again(
        tmp_path):
    """A process's own compiled graphs are in Inductor's local cache; one it dropped from
    there (``fresh_cache()``, ``FxGraphCache.clear()``) is compiled again, as without
    tunecache, not loaded back from the database it published it to. Other processes
    load it (tests/test_graph_sharing.py)."""
    seen = _job(tmp_path, _OWN_GRAPH_AGAIN, key=True)
    assert seen["first"] == [1, 0], seen
    assert seen["again"] == [1, 0], seen
