"""tunecache.inductor: Inductor's GEMM autotuning through the shared cache.

Two tiers:

* compile tests run real ``torch.compile(mode="max-autotune-no-cudagraphs")`` on CPU in
  subprocesses (tests/inductor_worker.py), each with a fresh TORCHINDUCTOR_CACHE_DIR and
  the FX graph / AOTAutograd caches off, so every GEMM key really reaches the autotuner:
  bmm (ATen vs the C++ bmm template) and a frozen nn.Linear (mkl packed_linear vs the
  C++ GEMM template). Benchmarks are counted by the hook's wrapper around Inductor's real
  benchmark callable (``tunecache.inductor.stats``), not by mocking Inductor.
* hook tests call the hooked selector with fake kernels in this process, or drive the
  deferred (MultiTemplateBuffer) path, which the CPU C++ backend never takes, with real
  scheduler objects (tests/inductor_fakes.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor.select_algorithm import get_algorithm_selector_cache  # noqa: E402

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402
from tunecache.inductor.state import REGISTRY  # noqa: E402
from tunecache.process import PROCESS  # noqa: E402

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

import inductor_fakes as fakes  # noqa: E402

OPS = ("bmm", "packed_linear")


# ------------------------------------------------------------------ subprocess helpers


def _env(tmp: Path, db: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    cache_dir = tmp / f"inductor-{time.monotonic_ns()}"
    cache_dir.mkdir(parents=True)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(cache_dir),
        TORCHINDUCTOR_FX_GRAPH_CACHE="0",
        TORCHINDUCTOR_AUTOGRAD_CACHE="0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    if db is not None:
        env["TUNECACHE_DB"] = db
    env.update(extra)
    return env


def _start(tmp: Path, name: str, db: str | None, *args: str,
           **env: str) -> tuple[subprocess.Popen, Path]:
    out = tmp / f"{name}.json"
    log = open(tmp / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "inductor_worker.py"), "--out", str(out), *args],
        env=_env(tmp, db, **env),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(tmp),
    )
    return proc, out


def _finish(tmp: Path, name: str, proc: subprocess.Popen, out: Path) -> dict[str, Any]:
    rc = proc.wait(timeout=300)
    log_text = (tmp / f"{name}.log").read_text()
    assert rc == 0, f"worker {name} failed:\n{log_text[-4000:]}"
    result = json.loads(out.read_text())
    result["log"] = log_text
    return result


def _run(tmp: Path, name: str, db: str | None, *args: str, **env: str) -> dict[str, Any]:
    proc, out = _start(tmp, name, db, *args, **env)
    return _finish(tmp, name, proc, out)


def _winners(result: dict[str, Any]) -> dict[str, str]:
    """op -> winning candidate, from the first lookup of each op."""
    winners: dict[str, str] = {}
    for event in result["stats"]["events"]:
        winners.setdefault(event["op"], event["best"])
    return winners


def _benchmarked_ops(result: dict[str, Any]) -> list[str]:
    return [e["op"] for e in result["stats"]["events"] if e["source"] in ("tuned", "local")]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- compile tests (slow)


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> dict[str, Any]:
    """Two processes compile bmm + frozen Linear together on an empty database."""
    tmp = tmp_path_factory.mktemp("cold")
    db = tmp / "tune.db"
    barrier = ("--barrier", str(tmp / "barrier"), "--parties", "2")  # start together
    (tmp / "barrier").mkdir()
    a = _start(tmp, "a", str(db), *barrier)
    b = _start(tmp, "b", str(db), *barrier)
    return {"tmp": tmp, "db": db, "runs": [_finish(tmp, "a", *a), _finish(tmp, "b", *b)]}


@pytest.fixture(scope="module")
def warm(cold) -> dict[str, Any]:
    """A later process (fresh Inductor cache dir), activated through the autoload hook."""
    return _run(cold["tmp"], "warm", str(cold["db"]), "--activation", "autoload")


@pytest.fixture(scope="module")
def side_runs(cold, warm) -> dict[str, Any]:
    """Three bmm-only processes at once: changed torch version (readwrite, own copy of the
    warm database), the same in readonly mode, and an unreachable database."""
    tmp = cold["tmp"]
    rw_db, ro_db = tmp / "rw.db", tmp / "ro.db"
    shutil.copy(cold["db"], rw_db)
    shutil.copy(cold["db"], ro_db)
    ro_before = _sha(ro_db)
    # Another build of this torch's release: its keys differ, and the recorded entries are
    # not of an older release (those would be an upgrade's starting point).
    fake = ["--ops", "bmm", "--fake-torch-version",
            f"{torch.__version__.split('+')[0]}+tunecache.test"]
    procs = {
        "version": _start(tmp, "version", str(rw_db), *fake),
        "readonly": _start(tmp, "readonly", str(ro_db), *fake, TUNECACHE_MODE="readonly"),
        "unreachable": _start(
            tmp, "unreachable", "postgresql://tunecache@127.0.0.1:1/x", "--ops", "bmm",
            TUNECACHE_LOCK_TIMEOUT="5",
        ),
    }
    runs = {name: _finish(tmp, name, *p) for name, p in procs.items()}
    runs["readonly_db_unchanged"] = _sha(ro_db) == ro_before
    return runs


def test_two_concurrent_processes_benchmark_each_gemm_key_exactly_once(cold):
    a, b = cold["runs"]
    assert a["enabled"] and b["enabled"]
    assert sorted(_benchmarked_ops(a) + _benchmarked_ops(b)) == sorted(OPS)
    assert a["stats"]["benchmarks"] + b["stats"]["benchmarks"] == len(OPS)
    # whoever did not tune a key waited for the peer or found it done
    for run in (a, b):
        assert {e["source"] for e in run["stats"]["events"]} <= {"tuned", "peer", "hit"}


def test_concurrent_processes_pick_identical_winners_and_outputs(cold):
    a, b = cold["runs"]
    assert set(_winners(a)) == set(OPS)
    assert _winners(a) == _winners(b)
    assert a["outputs"] == b["outputs"]


def test_later_process_activated_by_autoload_benchmarks_no_gemm(cold, warm):
    assert warm["enabled"]
    assert warm["stats"]["benchmarks"] == 0
    assert warm["stats"]["hits"] == len(OPS)
    assert _winners(warm) == _winners(cold["runs"][0])
    assert warm["outputs"] == cold["runs"][0]["outputs"]
    # and the ops really were looked up, i.e. lowering happened (no FX graph cache hit)
    assert {e["op"] for e in warm["stats"]["events"]} == set(OPS)


def test_changed_torch_version_misses_and_tunes_again(side_runs):
    run = side_runs["version"]
    assert run["stats"]["benchmarks"] == 1
    assert [e["source"] for e in run["stats"]["events"]] == ["tuned"]


def test_readonly_mode_tunes_locally_and_never_writes(side_runs):
    run = side_runs["readonly"]
    assert run["stats"]["benchmarks"] == 1
    assert [e["source"] for e in run["stats"]["events"]] == ["local"]
    assert side_runs["readonly_db_unchanged"]


def test_unreachable_database_still_compiles_with_inductor_timings(side_runs, cold):
    run = side_runs["unreachable"]
    assert run["enabled"]
    assert run["stats"]["benchmarks"] == 1
    assert len(run["outputs"]["bmm"]) == len(cold["runs"][0]["outputs"]["bmm"])
    expected = torch.tensor(cold["runs"][0]["outputs"]["bmm"])
    assert torch.allclose(torch.tensor(run["outputs"]["bmm"]), expected, rtol=1e-4, atol=1e-4)
    assert run["log"].count("tuning locally in this process") <= 1


# ------------------------------------------------------------------- hook tests (fast)


@pytest.fixture(autouse=True)
def _own_inductor_cache_dir(tmp_path, monkeypatch):
    """Inductor's local autotune cache (the fallback path) must not touch the user's."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.fixture
def hooked(sqlite_url):
    """The hooks on a fresh SQLite file in this process; removed afterwards."""
    tunecache.reset_stats()
    assert tunecache.enable(db=sqlite_url)
    yield sqlite_url
    tunecache.disable()
    tunecache.reset_stats()


def _rehook(url: str) -> None:
    """A new process's view: forget what this one read (the memo) but keep the database."""
    tunecache.disable()
    tunecache.enable(db=url)


def test_changed_candidate_list_benchmarks_only_the_new_candidates(hooked):
    calls: list[list[str]] = []
    bench = fakes.fake_benchmark(calls, {"aten": 2.0, "tmpl_a": 1.0, "tmpl_b": 0.5})
    first = fakes.lookup([fakes.FakeChoice("aten"), fakes.FakeChoice("tmpl_a")], "mm", "k", bench)
    assert calls == [["aten", "tmpl_a"]]
    assert sorted(first.values()) == [1.0, 2.0]

    _rehook(hooked)
    choices = [fakes.FakeChoice(n) for n in ("aten", "tmpl_a", "tmpl_b")]
    merged = fakes.lookup(choices, "mm", "k", bench)
    assert calls[1:] == [["tmpl_b"]]  # only the candidate the entry lacked
    assert {c.name: t for c, t in merged.items()} == {"aten": 2.0, "tmpl_a": 1.0, "tmpl_b": 0.5}

    _rehook(hooked)
    again = fakes.lookup([fakes.FakeChoice(n) for n in ("aten", "tmpl_a", "tmpl_b")], "mm", "k",
                         bench)
    assert len(calls) == 2  # base entry + derived "extra_candidates" entry: all known
    assert {c.name: t for c, t in again.items()} == {"aten": 2.0, "tmpl_a": 1.0, "tmpl_b": 0.5}


def test_candidates_pruned_for_failing_to_compile_are_stored_so_every_path_hits(hooked):
    from torch._inductor.select_algorithm import get_algorithm_selector_cache

    calls: list[list[str]] = []
    bench = fakes.fake_benchmark(calls, {"aten": 2.0, "tmpl": 1.0, "big": 0.1})
    full = [fakes.FakeChoice(n) for n in ("aten", "tmpl", "big")]
    # An immediate lookup: make_precompile_fn saw all three, "big" failed to compile and
    # Inductor pruned it before asking for timings.
    get_algorithm_selector_cache().make_precompile_fn(full, "mm", "k")
    full[2].failed = True
    pruned = fakes.lookup(full[:2], "mm", "k", bench)
    assert calls == [["aten", "tmpl"]]
    assert {c.name: t for c, t in pruned.items()} == {"aten": 2.0, "tmpl": 1.0}
    _rehook(hooked)
    # A later process whose list still has "big" (its precompile was skipped): all known.
    again = fakes.lookup([fakes.FakeChoice(n) for n in ("aten", "tmpl", "big")], "mm", "k", bench)
    assert len(calls) == 1
    assert {c.name: t for c, t in again.items()} == {"aten": 2.0, "tmpl": 1.0, "big": math.inf}


def test_candidates_filtered_for_another_reason_are_not_stored_as_failed(hooked):
    from torch._inductor.select_algorithm import get_algorithm_selector_cache

    calls: list[list[str]] = []
    bench = fakes.fake_benchmark(calls, {"aten": 2.0, "tmpl": 1.0, "hinted": 0.1})
    full = [fakes.FakeChoice(n) for n in ("aten", "tmpl", "hinted")]
    get_algorithm_selector_cache().make_precompile_fn(full, "mm", "k")
    fakes.lookup(full[:2], "mm", "k", bench)  # "hinted" left out, but it did not fail
    _rehook(hooked)
    fakes.lookup([fakes.FakeChoice(n) for n in ("aten", "tmpl", "hinted")], "mm", "k", bench)
    assert calls == [["aten", "tmpl"], ["hinted"]]  # a real new candidate: measured


def test_stored_candidates_missing_from_this_compile_are_ignored(hooked):
    calls: list[list[str]] = []
    bench = fakes.fake_benchmark(calls, {"aten": 2.0, "gone": 0.1, "tmpl": 1.0})
    fakes.lookup([fakes.FakeChoice(n) for n in ("aten", "gone", "tmpl")], "mm", "k", bench)
    _rehook(hooked)
    answer = fakes.lookup([fakes.FakeChoice(n) for n in ("aten", "tmpl")], "mm", "k", bench)
    assert len(calls) == 1
    assert {c.name: t for c, t in answer.items()} == {"aten": 2.0, "tmpl": 1.0}


def test_precompile_probe_answers_only_full_hits_and_never_claims(hooked):
    calls: list[list[str]] = []
    bench = fakes.fake_benchmark(calls, {})
    assert fakes.lookup([fakes.FakeChoice("x"), fakes.FakeChoice("y")], "mm", "k", None) == {}
    fakes.lookup([fakes.FakeChoice("x"), fakes.FakeChoice("y")], "mm", "k", bench)
    _rehook(hooked)
    probe = fakes.lookup([fakes.FakeChoice("x"), fakes.FakeChoice("y")], "mm", "k", None)
    assert sorted(c.name for c in probe) == ["x", "y"]
    partial = fakes.lookup([fakes.FakeChoice(n) for n in ("x", "y", "z")], "mm", "k", None)
    assert partial == {}
    assert len(calls) == 1


def test_inductor_benchmark_error_propagates_unchanged(hooked):
    class Boom(RuntimeError):
        pass

    def bench(choices):
        raise Boom("kernel crashed")

    with pytest.raises(Boom, match="kernel crashed"):
        fakes.lookup([fakes.FakeChoice("a"), fakes.FakeChoice("b")], "mm", "k", bench)


def test_tunecache_failure_warns_once_and_falls_back_to_inductor(hooked, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated tunecache bug")

    monkeypatch.setattr(tunecache.TuneCache, "get_or_tune", broken)
    calls: list[list[str]] = []
    bench = fakes.fake_benchmark(calls, {"a": 1.0, "b": 2.0})
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for key in ("k1", "k2"):
            got = fakes.lookup([fakes.FakeChoice("a"), fakes.FakeChoice("b")], "mm", key, bench)
            assert {c.name: t for c, t in got.items()} == {"a": 1.0, "b": 2.0}
    warnings = [r for r in caplog.records if "simulated tunecache bug" in r.getMessage()]
    assert len(warnings) == 1
    assert tunecache.stats().gemm.fallbacks == 2
    assert len(calls) == 2  # Inductor's own lookup benchmarked each key once


def test_entry_without_a_finite_timing_for_this_compile_is_not_trusted(hooked, caplog):
    calls: list[list[str]] = []
    bench = fakes.fake_benchmark(calls, {"a": math.inf, "b": 1.0})
    fakes.lookup([fakes.FakeChoice("a"), fakes.FakeChoice("b")], "mm", "k", bench)
    _rehook(hooked)
    # "b" (the only finite one) is gone from this compile: re-measure with Inductor's own
    got = fakes.lookup([fakes.FakeChoice("a")], "mm", "k", fakes.fake_benchmark(calls, {"a": 3.0}))
    assert {c.name: t for c, t in got.items()} == {"a": 3.0}
    assert calls == [["a", "b"], ["a"]]


def test_count_only_mode_counts_inductor_benchmarks_without_a_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNECACHE_DB", str(tmp_path / "unused.db"))
    tunecache.reset_stats()
    assert tunecache.enable(count_only=True)
    try:
        calls: list[list[str]] = []
        inductor_config.autotune_local_cache = False
        fakes.lookup([fakes.FakeChoice("a"), fakes.FakeChoice("b")], "mm", "k",
                     fakes.fake_benchmark(calls, {}))
        assert tunecache.stats().gemm.benchmarks == 1
        assert tunecache.stats().gemm.candidates_benchmarked == 2
        assert inductor_config._pre_fusion_custom_pass is None
        assert not (tmp_path / "unused.db").exists()
    finally:
        inductor_config.autotune_local_cache = True
        tunecache.disable()
        tunecache.reset_stats()


def test_disable_restores_inductor_methods_and_the_previous_pre_fusion_pass(sqlite_url):
    from torch._inductor import custom_graph_pass

    # The class this torch's FX graph cache accepts as a scheduler pass (2.13 added
    # CustomSchedulerPass; 2.11 and 2.12 accept a CustomGraphPass).
    accepted = getattr(custom_graph_pass, "CustomSchedulerPass",
                       custom_graph_pass.CustomGraphPass)

    class Theirs(accepted):  # type: ignore[misc, valid-type]
        def __call__(self, nodes):
            self.seen = len(nodes)
            return nodes

        def uuid(self):
            return "theirs-v1"

    selector = get_algorithm_selector_cache()
    theirs = Theirs()
    inductor_config._pre_fusion_custom_pass = theirs
    try:
        tunecache.enable(db=sqlite_url)
        ours = inductor_config._pre_fusion_custom_pass
        assert isinstance(ours, accepted)  # keeps the FX graph cache usable
        assert ours.uuid() == ("tunecache-pre-fusion-v1", "theirs-v1")
        assert ours([]) == [] and theirs.seen == 0  # chained: theirs still runs
        selector_cls = type(selector)
        precompile = vars(selector_cls)["make_precompile_fn"]
        assert "lookup" in vars(selector_cls) and "lookup" not in vars(selector)
        tunecache.disable()
        assert "lookup" not in vars(selector_cls)
        assert vars(selector_cls)["make_precompile_fn"] is not precompile
        assert inductor_config._pre_fusion_custom_pass is theirs
    finally:
        tunecache.disable()
        inductor_config._pre_fusion_custom_pass = None


_MISSING = object()  # an attribute not in its owner's __dict__


def _patched_inductor_attributes() -> dict[str, Any]:
    """Every attribute tunecache's parts patch on Inductor, Dynamo and Triton (torch
    2.13), by name: the value
    each holds now (the object in the owner's ``__dict__`` for methods, so that a
    restored staticmethod counts as restored only if it is the very same object)."""
    from torch._inductor import remote_cache
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.choices import InductorChoices
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.runtime import autotune_cache, triton_heuristics
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner
    from torch._inductor.scheduler import Scheduler
    from triton.runtime.autotuner import Autotuner

    selector = get_algorithm_selector_cache()
    owners = {
        "Autotuner": (Autotuner, ("cache_results", "check_disk_cache", "run")),
        "AutotuneCache": (autotune_cache.AutotuneCache, ("create", "read_best")),
        "CachingAutotuner": (triton_heuristics.CachingAutotuner,
                             ("coordinate_descent_tuning", "autotune_to_one_config",
                              "_dynamic_scale_rblock", "precompile")),
        "CoordescTuner": (CoordescTuner, ("autotune_single_field", "call_func")),
        "TritonScheduling": (TritonScheduling, ("benchmark_codegened_module",)),
        "Scheduler": (Scheduler, ("compile_kernel", "speedup_by_fusion")),
        "AsyncCompile": (AsyncCompile, ("triton",)),
        "InductorChoices": (InductorChoices, ("get_template_configs",
                                              "_finalize_template_configs")),
    }
    found: dict[str, Any] = {
        f"{owner}.{name}": vars(cls).get(name, _MISSING)
        for owner, (cls, names) in owners.items() for name in names
    }
    for name in ("lookup", "make_precompile_fn"):  # on the class: later patches compose
        found[f"AlgorithmSelectorCache.{name}"] = vars(type(selector)).get(name, _MISSING)
    for name in ("_pre_fusion_custom_pass", "autotune_remote_cache", "compile_threads",
                 "distributed_max_autotune_gemm"):
        found[f"config.{name}"] = getattr(inductor_config, name)
    for name in ("RemoteAutotuneCache", "RemoteFxGraphCache", "RemoteAOTAutogradCache",
                 "RemoteDynamoPGOCache"):
        found[f"remote_cache.{name}"] = getattr(remote_cache, name)
    found["dynamo_config.automatic_dynamic_remote_pgo"] = (
        torch._dynamo.config.automatic_dynamic_remote_pgo)
    found["config.fx_graph_remote_cache"] = inductor_config.fx_graph_remote_cache
    # Where torch asks whether the remote AOTAutograd cache is on (tunecache answers
    # while the user leaves its flag None, and keeps it off while it does not serve it).
    for module_name in ("torch._functorch._aot_autograd.autograd_cache",
                        "torch._functorch.aot_autograd",
                        "torch._functorch._aot_autograd.graph_compile"):
        module = importlib.import_module(module_name)
        if callable(getattr(module, "should_use_remote_autograd_cache", None)):
            found[f"{module_name}.should_use_remote_autograd_cache"] = (
                module.should_use_remote_autograd_cache)
    return found


@contextlib.contextmanager
def _flags_enable_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Inductor flags set to values enable() changes, and the settings that make it change
    every attribute it can on this CPU: Triton sharing on, compile workers that cannot
    read this database (it is not TUNECACHE_DB, so compile_threads=1), graph sharing and
    Dynamo's shape profiles with a signing key. Yields the TuneCache. (Inductor's own
    config.patch, not monkeypatch: monkeypatch's undo deletes a config module attribute,
    after which torch says it "does not exist" in every later test.)"""
    from torch._functorch import config as functorch_config
    from torch._inductor.runtime import triton_heuristics  # noqa: F401 - runtime hooks too

    from tunecache.core.signing import PRIVATE_KEY_NAME, write_key_pair

    monkeypatch.delenv("TUNECACHE_DB", raising=False)
    write_key_pair(tmp_path / "keys")
    with inductor_config.patch(compile_threads=4, distributed_max_autotune_gemm=True,
                               autotune_remote_cache=None, fx_graph_remote_cache=None), \
            functorch_config.patch(enable_remote_autograd_cache=None), \
            torch._dynamo.config.patch(automatic_dynamic_remote_pgo=None), \
            tunecache.open(str(tmp_path / "tune.db"),
                           signing_key=str(tmp_path / "keys" / PRIVATE_KEY_NAME)) as cache:
        try:
            yield cache
        finally:
            tunecache.disable()


def _left_behind(before: dict[str, Any]) -> set[str]:
    after = _patched_inductor_attributes()
    return {name for name in before if after[name] is not before[name]}


def _registry_is_empty() -> None:
    assert REGISTRY.hooks is None and REGISTRY.triton is None and REGISTRY.graphs is None
    assert REGISTRY.pgo is None
    assert len(PROCESS.ledger) == 0, PROCESS.ledger.entries()
    assert not REGISTRY.runtime_hooks


def test_disable_restores_every_patched_inductor_attribute(tmp_path, monkeypatch):
    with _flags_enable_changes(tmp_path, monkeypatch) as cache:
        before = _patched_inductor_attributes()
        assert tunecache.enable(cache)
        try:
            during = _patched_inductor_attributes()
            changed = {name for name in before if during[name] is not before[name]}
            assert changed == set(before), f"not patched: {set(before) - changed}"
            # Everything enable() changed is in the ledger, and nothing else is.
            recorded = {name for _, name in PROCESS.ledger.entries()}
            assert {name.rsplit(".", 1)[1] for name in before} == recorded
        finally:
            tunecache.disable()
        assert _left_behind(before) == set()
        _registry_is_empty()


def test_enable_and_disable_twice_and_enable_while_enabled_leave_nothing_behind(
        tmp_path, monkeypatch):
    with _flags_enable_changes(tmp_path, monkeypatch) as cache:
        before = _patched_inductor_attributes()
        for _ in range(2):
            assert tunecache.enable(cache)
            during = _patched_inductor_attributes()
            entries = len(PROCESS.ledger)
            assert tunecache.enable(cache)  # replaces the hooks: patches nothing twice
            assert len(PROCESS.ledger) == entries
            again = _patched_inductor_attributes()
            assert {n for n in before if again[n] is before[n]} == \
                {n for n in before if during[n] is before[n]}
            tunecache.disable()
            assert _left_behind(before) == set()
            tunecache.disable()
            assert _left_behind(before) == set()
            _registry_is_empty()


class _Refused(Exception):
    """Raised by a class that does not let ``create`` be set."""


class _Interrupted(BaseException):
    """What a Ctrl-C half-way through enable() looks like to it."""


def _refusing_create(error: type[BaseException]) -> type:
    """A stand-in for Inductor's AutotuneCache, the same but for refusing to have its
    ``create`` replaced: Triton sharing fails after it changed other attributes."""
    from torch._inductor.runtime import autotune_cache as ac

    class Refusing(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            if name == "create":
                raise error("AutotuneCache.create cannot be set")
            super().__setattr__(name, value)

    return Refusing("AutotuneCache", (ac.AutotuneCache,),
                    {"create": ac.AutotuneCache.__dict__["create"]})


@contextlib.contextmanager
def _autotune_cache_refusing(error: type[BaseException]) -> Any:
    """Inductor's AutotuneCache, for the duration, one whose ``create`` cannot be set:
    a real failure half-way through enabling Triton sharing."""
    from torch._inductor.runtime import autotune_cache as ac

    own = ac.AutotuneCache
    ac.AutotuneCache = _refusing_create(error)
    try:
        yield
    finally:
        ac.AutotuneCache = own


def test_triton_sharing_failing_half_way_leaves_nothing_of_it_patched(tmp_path, monkeypatch):
    with _flags_enable_changes(tmp_path, monkeypatch) as cache, _autotune_cache_refusing(_Refused):
        before = _patched_inductor_attributes()
        assert tunecache.enable(cache)  # GEMM autotuning is shared all the same
        try:
            changed = {n for n in before if _patched_inductor_attributes()[n] is not before[n]}
            triton = {"remote_cache.RemoteAutotuneCache", "config.autotune_remote_cache",
                      "config.compile_threads"}
            assert changed & triton == set()
            assert "AlgorithmSelectorCache.lookup" in changed
            assert REGISTRY.triton is None
            assert {name for _, name in PROCESS.ledger.entries()} & {
                "RemoteAutotuneCache", "autotune_remote_cache", "compile_threads"} == set()
        finally:
            tunecache.disable()
        assert _left_behind(before) == set()
        _registry_is_empty()


def test_enable_interrupted_half_way_leaves_nothing_patched(tmp_path, monkeypatch):
    with _flags_enable_changes(tmp_path, monkeypatch) as cache, \
            _autotune_cache_refusing(_Interrupted):
        before = _patched_inductor_attributes()
        with pytest.raises(_Interrupted):
            tunecache.enable(cache)
        assert not tunecache.is_enabled()
        assert _left_behind(before) == set()
        _registry_is_empty()


def test_pre_fusion_pass_passes_the_fx_graph_cache_check_of_torch_2_11_and_2_13(sqlite_url):
    """torch 2.11 accepts only a ``CustomGraphPass`` as ``_pre_fusion_custom_pass`` (and
    reads its uuid); 2.13 only a ``CustomSchedulerPass``. Failing either made Inductor
    bypass its FX graph and AOTAutograd caches on every compile (seen with torch 2.11)."""
    import pickle

    from torch._inductor import custom_graph_pass

    try:
        tunecache.enable(db=sqlite_url)
        ours = inductor_config._pre_fusion_custom_pass
        assert isinstance(ours, custom_graph_pass.CustomGraphPass), \
            "torch 2.11's FX graph cache would bypass"
        # (2.11 and 2.12 have no CustomSchedulerPass)
        assert isinstance(ours, getattr(custom_graph_pass, "CustomSchedulerPass",
                                        custom_graph_pass.CustomGraphPass)), \
            "torch 2.13's FX graph cache would bypass"
        assert pickle.loads(pickle.dumps(ours.uuid())) == ("tunecache-pre-fusion-v1", None)
    finally:
        tunecache.disable()


def test_second_job_hits_inductor_graph_and_autograd_caches_with_every_hook_installed(tmp_path):
    """Two jobs in turn on one node (one TORCHINDUCTOR_CACHE_DIR), tunecache on with the
    Triton hooks too: the second loads the forward and backward graphs from Inductor's
    own caches, and nothing is bypassed."""
    env = _env(tmp_path, str(tmp_path / "tune.db"), TUNECACHE_SHARE="+triton")
    env.update(TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    runs = []
    for name in ("first", "second"):
        out = tmp_path / f"{name}.json"
        done = subprocess.run(
            [sys.executable, str(TESTS / "graph_cache_worker.py"), "--out", str(out)],
            env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        runs.append(json.loads(out.read_text()))
    first, second = runs
    assert first["enabled"] and second["enabled"]
    for run in runs:
        assert run["inductor"].get("fxgraph_cache_bypass", 0) == 0, run
        assert run["aot_autograd"].get("autograd_cache_bypass", 0) == 0, run
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 2  # forward and backward
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 2, second
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0, second
    assert second["aot_autograd"].get("autograd_cache_hit", 0) >= 1, second


def test_enable_turns_off_inductor_distributed_max_autotune_gemm(sqlite_url, caplog):
    inductor_config.distributed_max_autotune_gemm = True
    try:
        with caplog.at_level(logging.INFO, logger="tunecache"):
            tunecache.enable(db=sqlite_url)
        assert inductor_config.distributed_max_autotune_gemm is False
        assert sum("distributed_max_autotune_gemm" in r.getMessage() for r in caplog.records) == 1
    finally:
        tunecache.disable()
        inductor_config.distributed_max_autotune_gemm = False


def test_unsupported_torch_version_warns_once_and_installs_no_inductor_part(
        monkeypatch, sqlite_url, caplog):
    from tunecache.switch import parts_on

    monkeypatch.setattr(torch, "__version__", "2.10.0")
    monkeypatch.setattr(PROCESS, "explained", set())
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        try:
            assert tunecache.enable(db=sqlite_url) is False
            assert tunecache.enable(db=sqlite_url) is False
            # Users' Triton kernels do not depend on torch's version: only they are on.
            assert parts_on() == ["user_kernels"]
        finally:
            tunecache.disable()
    assert "lookup" not in vars(type(get_algorithm_selector_cache()))
    assert sum("2.10.0" in r.getMessage() for r in caplog.records) == 1


def test_mode_off_installs_nothing(monkeypatch, sqlite_url):
    monkeypatch.setenv("TUNECACHE_MODE", "off")
    assert tunecache.enable(db=sqlite_url) is False
    assert not tunecache.is_enabled()


def test_triton_candidate_identity_has_no_device_index():
    from torch._inductor.select_algorithm import TritonTemplateCaller

    def triton_choice(name: str) -> Any:
        choice = TritonTemplateCaller.__new__(TritonTemplateCaller)
        choice.name = name
        choice.description = "ACC_TYPE='tl.float32', BLOCK_K=32, BLOCK_M=64, num_warps=4"
        return choice

    # the counter suffix differs between ranks and graphs; the identity does not
    assert tc_inductor.candidate_id(triton_choice("triton_mm_3")) == tc_inductor.candidate_id(
        triton_choice("triton_mm_17")
    )
    assert tc_inductor.candidate_id(triton_choice("triton_mm_3")).startswith("triton:triton_mm:")


def test_key_carries_fingerprint_op_inputs_precision_and_hint():
    key = tc_inductor.make_key("mm", "[('cpu', 'torch.float32', 8, 8)]", 64, "cpu")
    assert key["kind"] == "gemm" and key["op"] == "mm" and key["hint_override"] == 64
    assert key["precision"] == torch.get_float32_matmul_precision()
    env = key["env"]
    assert env["torch"] == torch.__version__ and env["device_type"] == "cpu"
    assert {"device", "triton", "cuda", "hip", "threads", "isa"} <= set(env)
    assert all(isinstance(v, str) for v in env.values())
    assert "inductor.max_autotune_gemm_backends" in env


# -------------------------------------------------------- deferred path, multi-process


def _deferred(tmp: Path, db: Path, graphs: dict[str, str]) -> dict[str, dict[str, Any]]:
    barrier = tmp / "barrier"  # the ranks start together
    barrier.mkdir()
    procs = {}
    for name, keys in graphs.items():
        out = tmp / f"{name}.json"
        log = open(tmp / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        procs[name] = (
            subprocess.Popen(
                [sys.executable, str(TESTS / "inductor_deferred_worker.py"), "--keys", keys,
                 "--out", str(out), "--barrier", str(barrier),
                 "--parties", str(len(graphs))],
                # These ranks compile no C++: the vector ISA of their keys' CPU
                # fingerprint is read from the CPU's flags, not from test builds (a
                # minute a process on a loaded machine, before the claims start).
                env=_env(tmp, str(db), TORCHINDUCTOR_VEC_ISA_OK="1"), stdout=log,
                stderr=subprocess.STDOUT,
            ),
            out,
        )
    results = {}
    for name, (proc, out) in procs.items():
        assert proc.wait(timeout=300) == 0, (tmp / f"{name}.log").read_text()[-3000:]
        results[name] = json.loads(out.read_text())
    return results


def test_deferred_gemms_of_a_graph_are_split_between_ranks_and_tuned_once(tmp_path):
    runs = _deferred(tmp_path, tmp_path / "tune.db", {"r0": "k1,k2,k3,k4", "r1": "k1,k2,k3,k4"})
    benchmarked = sorted(n for r in runs.values() for call in r["benchmarked"] for n in call)
    assert benchmarked == sorted(f"{p}_{k}" for k in ("k1", "k2", "k3", "k4")
                                 for p in ("aten", "tmpl"))
    assert runs["r0"]["timings"] == runs["r1"]["timings"]  # same winner everywhere


def test_ranks_compiling_different_graphs_do_not_hang(tmp_path):
    runs = _deferred(tmp_path, tmp_path / "tune.db", {"r0": "k1,k2", "r1": "k2,k3"})
    benchmarked = sorted(call[0] for r in runs.values() for call in r["benchmarked"])
    assert benchmarked == ["aten_k1", "aten_k2", "aten_k3"]


# ------------------------------------------------------------------------------ autoload

_AUTOLOAD_PROBE = """
import sys
from tunecache import _autoload
_autoload.torch_backend_entry()
finder = any(type(f).__name__ == "_Finder" for f in sys.meta_path)
print(finder, "torch" in sys.modules, "torch._inductor" in sys.modules)
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "False False False"),
        ({"TUNECACHE_DB": "/nonexistent/tune.db", "TUNECACHE_MODE": "off"}, "False False False"),
        # set: only a post-import finder; torch._inductor is imported by the user's compile
        ({"TUNECACHE_DB": "/nonexistent/tune.db"}, "True False False"),
    ],
    ids=["db-unset", "mode-off", "db-set"],
)
def test_autoload_entry_point_is_cheap_and_imports_no_torch(tmp_path, env, expected):
    out = subprocess.run(
        [sys.executable, "-c", _AUTOLOAD_PROBE],
        env={**_env(tmp_path, None), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == expected
