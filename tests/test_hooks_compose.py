"""tunecache's GEMM hooks compose with patches made after it is on.

PyTorch's own tests (test/inductor/test_cpu_select_algorithm.py, test_max_autotune.py)
patch ``AlgorithmSelectorCache.lookup`` on the class to steer the selection; a profiler or
a user's selection override does the same. That patch must win for its duration, and
tunecache must serve again after it ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

from torch._inductor import codecache, select_algorithm  # noqa: E402

import tunecache  # noqa: E402
from tunecache import switch  # noqa: E402
from tunecache.inductor.state import REGISTRY  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# One process: a bmm compiled under max-autotune with tunecache on (it tunes and stores),
# again under a class-level patch of lookup that makes tunecache's winner the slowest (as
# test_cpu_select_algorithm.py's skip_cache penalises ATen), and again after the patch.
_WORKER = r"""
import json, sys
from unittest.mock import patch
import torch
import torch._inductor.config as inductor_config
import torch._inductor.select_algorithm as select_algorithm
from torch._dynamo.utils import counters
import tunecache
from tunecache.inductor.gemm import candidate_id

assert tunecache.enable()
a, b = torch.randn(4, 32, 48), torch.randn(4, 48, 40)

def compile_once():
    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(lambda x, y: torch.bmm(x, y).relu(), mode="max-autotune-no-cudagraphs")
    with torch.no_grad():
        out = fn(a, b)
    assert torch.allclose(out, torch.bmm(a, b).relu(), atol=1e-4)
    gemm = tunecache.stats().gemm.as_dict()
    return counters["inductor"]["cpp_templated_kernel_counter"], gemm

with inductor_config.patch(max_autotune_gemm_backends="CPP,ATEN"):
    templated, first = compile_once()
    stored_best = next(e["best"] for e in first["events"] if e["op"] == "bmm")
    calls = []

    def skip_cache(self, choices, name, key, benchmark, hint_override=None):
        calls.append(name)
        if benchmark is None:
            return {}
        timings = benchmark(choices)
        for choice in timings:
            if candidate_id(choice) == stored_best:
                timings[choice] *= 1e6
        return timings

    with patch.object(select_algorithm.AlgorithmSelectorCache, "lookup", skip_cache):
        patched_templated, during = compile_once()
    after_templated, after = compile_once()

print(json.dumps({
    "stored_best": stored_best, "templated": [templated, patched_templated, after_templated],
    "patched_calls": calls,
    "lookups": [len(s["events"]) for s in (first, during, after)],
    "sources": [e["source"] for e in after["events"]],
}))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    (tmp_path / "inductor").mkdir()
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
               TUNECACHE_DB=str(tmp_path / "tune.db"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])))
    return env


def test_a_class_level_lookup_patch_wins_and_tunecache_serves_after_it(tmp_path):
    done = subprocess.run([sys.executable, "-c", _WORKER], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    first, during, after = result["templated"]
    assert result["patched_calls"], "the patched lookup was never called"
    # The patch's choice wins: tunecache's winner was made the slowest.
    best_is_template = not result["stored_best"].startswith("extern:")
    assert first == int(best_is_template) and during == int(not best_is_template), result
    # tunecache answered nothing while the patch held, and serves from its store after.
    lookups_first, lookups_during, lookups_after = result["lookups"]
    assert lookups_during == lookups_first, result
    assert lookups_after > lookups_during and after == first, result
    assert set(result["sources"][lookups_during:]) <= {"local", "hit", "memo"}, result


def _own(name: str) -> object:
    return vars(select_algorithm.AlgorithmSelectorCache).get(name, None)


def test_hooks_are_on_the_class_hidden_by_a_patch_and_given_back_by_identity(sqlite_url):
    cls = select_algorithm.AlgorithmSelectorCache
    precompile_before = _own("make_precompile_fn")
    assert _own("lookup") is None  # inherited from PersistentCache
    assert tunecache.enable(db=sqlite_url)
    try:
        ours = _own("lookup")
        assert getattr(ours, "tunecache_hook", False)
        hooks = REGISTRY.hooks
        assert hooks is not None and hooks.serving()

        def theirs(self, choices, op, inputs, benchmark, hint_override=None):
            return {}

        with mock.patch.object(cls, "lookup", theirs):
            assert not hooks.serving()
        assert _own("lookup") is ours and hooks.serving()
        # A base class's lookup patched: ours passes through to it, and serves nothing.
        with mock.patch.object(codecache.PersistentCache, "lookup", theirs):
            assert not hooks.serving()
            selector = select_algorithm.get_algorithm_selector_cache()
            assert selector.lookup([], "mm", "k", lambda c: {}) == {}
        # The instance patched.
        selector = select_algorithm.get_algorithm_selector_cache()
        with mock.patch.object(selector, "lookup", theirs):
            assert not hooks.serving()
        assert hooks.serving()
    finally:
        tunecache.disable()
    assert _own("lookup") is None
    assert _own("make_precompile_fn") is precompile_before


def test_a_hook_left_behind_by_a_disable_under_a_patch_passes_through(sqlite_url,
                                                                      monkeypatch):
    cls = select_algorithm.AlgorithmSelectorCache
    assert tunecache.enable(db=sqlite_url)
    ours, hooks = _own("lookup"), REGISTRY.hooks

    def boom(*args, **kwargs):
        raise AssertionError("a disabled tunecache answered a lookup")

    monkeypatch.setattr(hooks, "lookup", boom)
    try:
        with mock.patch.object(cls, "lookup", lambda *a, **k: {}):
            tunecache.disable()  # the ledger leaves the patch; mock then puts ours back
        assert _own("lookup") is ours and REGISTRY.hooks is None
        # Inductor's own lookup answers (no choices: nothing to time).
        assert select_algorithm.get_algorithm_selector_cache().lookup(
            [], "mm", "k", None) == {}
    finally:
        if _own("lookup") is ours:
            delattr(cls, "lookup")


def _skip_cache(self, choices, name, key, benchmark, hint_override=None):
    """test_cpu_select_algorithm.py's patch: its parameters are named otherwise than
    Inductor's lookup."""
    return {} if benchmark is None else benchmark(choices)


def test_a_patch_active_at_enable_keeps_its_place_and_the_hook_comes_after_it(sqlite_url):
    cls = select_algorithm.AlgorithmSelectorCache
    with mock.patch.object(cls, "lookup", _skip_cache):
        assert tunecache.enable(db=sqlite_url)  # the probe reads Inductor's own lookup
        try:
            hooks = REGISTRY.hooks
            assert hooks is not None and "gemm" in switch.parts_on()
            assert _own("lookup") is _skip_cache and not hooks.serving()
            assert getattr(_own("make_precompile_fn"), "tunecache_hook", False)
        except BaseException:
            tunecache.disable()
            raise
    try:
        assert _own("lookup") is None  # the patch ended: Inductor's own shows
        assert hooks.serving()  # ... and tunecache's hook is installed over it
        assert getattr(_own("lookup"), "tunecache_hook", False)
    finally:
        tunecache.disable()
    assert _own("lookup") is None


def test_both_methods_patched_at_enable_are_hooked_once_both_patches_end(sqlite_url):
    cls = select_algorithm.AlgorithmSelectorCache
    precompile = _own("make_precompile_fn")

    def their_precompile(self, choices, name, inputs_key, *args, **kwargs):
        return lambda: {}

    try:
        with mock.patch.object(cls, "make_precompile_fn", their_precompile), \
                mock.patch.object(cls, "lookup", _skip_cache):
            assert tunecache.enable(db=sqlite_url)
            hooks = REGISTRY.hooks
            assert not hooks.serving()
            assert _own("lookup") is _skip_cache
            assert _own("make_precompile_fn") is their_precompile
        assert hooks.serving()
        assert all(getattr(_own(name), "tunecache_hook", False)
                   for name in ("lookup", "make_precompile_fn"))
    finally:
        tunecache.disable()
    assert _own("lookup") is None and _own("make_precompile_fn") is precompile


def test_a_disabled_tunecache_does_not_hook_after_the_patch_ends(sqlite_url):
    cls = select_algorithm.AlgorithmSelectorCache
    with mock.patch.object(cls, "lookup", _skip_cache):
        assert tunecache.enable(db=sqlite_url)
        hooks = REGISTRY.hooks
        tunecache.disable()
    assert not hooks.serving()
    assert _own("lookup") is None


# The worker above, with tunecache turned on again while the patch is active: the patch
# wins for its duration, and tunecache serves once it ends.
_ENABLED_UNDER_THE_PATCH = _WORKER.replace("assert tunecache.enable()\n", "").replace(
    "    templated, first = compile_once()\n",
    "    assert tunecache.enable()\n"
    "    templated, first = compile_once()\n"
    "    tunecache.disable()\n").replace(
    "skip_cache):\n        patched_templated, during = compile_once()\n",
    "skip_cache):\n        assert tunecache.enable()\n"
    "        patched_templated, during = compile_once()\n")


def test_a_lookup_patch_active_at_enable_wins_and_tunecache_serves_after_it(tmp_path):
    assert _ENABLED_UNDER_THE_PATCH.count("tunecache.enable()") == 2
    done = subprocess.run([sys.executable, "-c", _ENABLED_UNDER_THE_PATCH],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    first, during, after = result["templated"]
    assert result["patched_calls"], "the patched lookup was never called"
    best_is_template = not result["stored_best"].startswith("extern:")
    assert first == int(best_is_template) and during == int(not best_is_template), result
    lookups_first, lookups_during, lookups_after = result["lookups"]
    assert lookups_during == lookups_first, result
    assert lookups_after > lookups_during and after == first, result
    assert set(result["sources"][lookups_during:]) <= {"local", "hit", "memo"}, result
