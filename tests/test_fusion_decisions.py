"""Epilogue-fusion decisions shared across sizes, graphs and ranks
(tunecache/inductor/triton/decisions.py, sites.py, decision_replay.py).

The store side runs on real SQLite files and the real PostgreSQL server, with a real
second process. The site's structure is read from the scheduler nodes of real CPU
compiles. Inductor's GPU-only part of ``speedup_by_fusion`` (a MultiTemplateBuffer's
candidates, compiled by Triton) cannot run here: those tests drive tunecache's wrapper
around it with a template whose choices are real ``TritonTemplateCaller`` objects (only
their names set) and a stand-in for Inductor's benchmarking decision that times its
candidates through the real, wrapped ``TritonScheduling.benchmark_codegened_module``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor.scheduler import FusionResult, Scheduler  # noqa: E402
from torch._inductor.select_algorithm import TritonTemplateCaller  # noqa: E402

import tunecache  # noqa: E402
from tunecache.inductor.triton import decision_replay, decisions  # noqa: E402
from tunecache.inductor.triton.decisions import Decision  # noqa: E402
from tunecache.inductor.triton.sites import FusionSite, epilogue_structure  # noqa: E402

ENV = {"device": "H200", "torch": "2.11"}
SITE = {"gemm": {"inputs": [["torch.bfloat16", 2, [1, 0]]] * 2}, "epilogue": ["sum"]}


def _key(tokens: int) -> Any:
    return decisions.decision_key(ENV, SITE, [tokens, 4096, 4096, 4096])


def _sizes(tokens: int) -> list[int]:
    return [tokens, 4096, 4096, 4096]


FUSES = Decision.of(2.0, [1.0, 1.5], rank=0)  # fused 2x faster, runner-up 1.5x slower
STAYS = Decision.of(1.0, [2.0], rank=None)


def _record(cache: tunecache.TuneCache, tokens: int, decision: Decision) -> None:
    assert decisions.settle(cache, _key(tokens), decision, _sizes(tokens)) == decision


# -- the decision and its entry


def test_a_decision_is_inductors_rule_on_its_timings():
    assert Decision.of(2.0, [1.5, 1.0], rank=1) == Decision(2.0, 1.0, 1.5, 1)
    # The fastest fused candidate is no faster than the GEMM and epilogue apart.
    assert Decision.of(1.0, [1.0], rank=0) == Decision(1.0, 1.0, None, None)
    assert FUSES.margin() == pytest.approx(0.5)  # runner-up's margin is the smaller
    assert STAYS.margin() == pytest.approx(1.0)
    assert Decision.of(1.0, [float("inf")], rank=None).margin() == float("inf")


@pytest.mark.parametrize("timings, meta", [
    ({"unfused": 2.0, "fused": 1.0}, {}),  # a fusion without its candidate
    ({"unfused": 2.0, "fused": 1.0}, {"rank": True}),
    ({"unfused": 2.0, "fused": 1.0}, {"rank": 64}),
    ({"unfused": 2.0, "fused": 1.0}, {"rank": -1}),
    ({"unfused": 2.0, "fused": 1.0}, {"rank": "0"}),
    ({"unfused": 1.0, "fused": 2.0}, {"rank": 0}),  # a candidate for no fusion
    ({"unfused": 2.0}, {}),
    ({"unfused": 2.0, "fused": 1.0, "ms": 1.0}, {"rank": 0}),
])
def test_an_entry_that_is_not_a_decision_we_write_is_refused(timings, meta):
    assert Decision.from_entry(timings, meta) is None


def test_a_decision_reads_back_from_its_entry():
    for decision in (FUSES, STAYS, Decision.of(2.0, [1.0], rank=3)):
        assert Decision.from_entry(decision.timings(), decision.meta([1])) == decision


# -- the store: every rank follows the first decision published


def test_the_first_decision_published_is_the_one_every_rank_follows(db_url):
    first = tunecache.open(db_url)
    second = tunecache.open(db_url)
    try:
        assert decisions.settle(first, _key(4096), FUSES, _sizes(4096)) == FUSES
        assert decisions.settle(second, _key(4096), STAYS, _sizes(4096)) == FUSES
        assert decisions.stored_decision(second, _key(4096)) == FUSES
    finally:
        first.close()
        second.close()


def test_two_processes_deciding_one_site_at_once_settle_on_one_decision(tmp_path):
    db = str(tmp_path / "tune.db")
    tunecache.open(db).close()  # the schema, before two processes race to make it
    tests = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tests.parent), str(tests),
                                                      env.get("PYTHONPATH")]))
    ranks = [subprocess.Popen([sys.executable, str(tests / "fusion_decision_worker.py"), db,
                               str(tmp_path), str(i)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=240)
        assert rank.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    # Rank 0 measured a fusion, rank 1 none; both run the one published.
    assert results[0] == results[1]
    assert results[0]["rank"] in (0, None)
    cache = tunecache.open(db)
    try:
        stored = decisions.stored_decision(cache, _key(4096))
        assert stored is not None and stored.rank == results[0]["rank"]
    finally:
        cache.close()


# -- neighbours decide a new size


@pytest.fixture
def recorded(tmp_path):
    cache = tunecache.open(str(tmp_path / "tune.db"))
    yield cache
    cache.close()


def test_neighbours_that_agree_clearly_decide_a_new_size_and_publish_it(recorded):
    for tokens in (1024, 8192, 16384):
        _record(recorded, tokens, FUSES)
    decided = decisions.decided_by_neighbours(recorded, _key(4096), _sizes(4096))
    assert decided == FUSES
    entry = recorded.lookup(_key(4096))
    assert entry is not None and entry.meta["rank"] == 0
    assert entry.meta["transfer"]["benchmarked"] == 0
    assert len(entry.meta["transfer"]["from"]) == decisions.DECIDING_SITES


@pytest.mark.parametrize("others", [
    [FUSES, STAYS],  # they disagree
    [FUSES, Decision.of(2.0, [1.0, 1.5], rank=1)],  # another candidate won
    [FUSES, Decision.of(1.05, [1.0], rank=0)],  # fused by 5 %
    [FUSES, Decision.of(2.0, [1.0, 1.02], rank=0)],  # a runner-up 2 % behind
])
def test_neighbours_that_disagree_or_decided_narrowly_decide_nothing(recorded, others):
    for tokens, decision in zip((8192, 16384), others):
        _record(recorded, tokens, decision)
    assert decisions.decided_by_neighbours(recorded, _key(4096), _sizes(4096)) is None
    assert recorded.lookup(_key(4096)) is None


def test_a_decided_site_never_decides_for_another(recorded):
    _record(recorded, 16384, FUSES)
    assert decisions.decided_by_neighbours(recorded, _key(8192), _sizes(8192)) == FUSES
    # 8192 is nearer to 4096 than 16384, and was itself decided: nothing is decided.
    assert decisions.decided_by_neighbours(recorded, _key(4096), _sizes(4096)) is None


def test_a_neighbour_too_far_away_decides_nothing(recorded):
    _record(recorded, 65536, FUSES)  # four octaves from 4096
    assert decisions.decided_by_neighbours(recorded, _key(4096), _sizes(4096)) is None


def test_a_site_a_peer_has_claimed_is_left_to_measure(recorded, tmp_path):
    _record(recorded, 8192, FUSES)
    peer = tunecache.open(recorded.settings.db_url)
    try:
        claim = peer.claim(_key(4096))
        assert claim is not None and not isinstance(claim, tunecache.Result)
        assert decisions.decided_by_neighbours(recorded, _key(4096), _sizes(4096)) is None
        peer.release(claim, "test over")
    finally:
        peer.close()


def test_a_planted_neighbour_decides_nothing_and_costs_the_site_nothing(recorded):
    _record(recorded, 8192, FUSES)
    claim = recorded.claim(_key(16384))
    # A rank that is "fused" with no candidate named: not a decision we write.
    recorded.publish(claim, {"unfused": 2.0, "fused": 1.0}, meta={"sizes": _sizes(16384)})
    assert decisions.decided_by_neighbours(recorded, _key(4096), _sizes(4096)) == FUSES


# -- the site: one structure at every size


def _structures(fn: Any, *args: Any) -> list[Any]:
    """The epilogue structure of every pair the scheduler considered fusing while
    compiling ``fn`` on the CPU."""
    seen: list[Any] = []
    inductors = Scheduler.speedup_by_fusion

    def spy(self: Any, node1: Any, node2: Any) -> Any:
        seen.append(epilogue_structure(list(node2.get_nodes()),
                                       set(node1.get_buffer_names())))
        return inductors(self, node1, node2)

    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as mp, inductor_config.patch(force_disable_caches=True):
        mp.setattr(Scheduler, "speedup_by_fusion", spy)
        torch.compile(fn, dynamic=False)(*args)
    return seen


def _relu_epilogue(x: Any, w: Any) -> Any:
    y = torch.mm(x, w) * 2 + 1
    return y, torch.relu(y) * 3


def _sigmoid_epilogue(x: Any, w: Any) -> Any:
    y = torch.mm(x, w) * 2 + 1
    return y, torch.sigmoid(y) * 3


def test_an_epilogue_has_one_structure_at_every_size_and_another_for_another_op():
    # On the CPU the pointwise epilogue of an extern GEMM is what the scheduler fuses.
    small = _structures(_relu_epilogue, torch.randn(64, 32), torch.randn(32, 48))
    large = _structures(_relu_epilogue, torch.randn(256, 32), torch.randn(32, 96))
    assert small and None not in small
    assert small == large
    assert "buf" not in json.dumps(small)
    other = _structures(_sigmoid_epilogue, torch.randn(64, 32), torch.randn(32, 48))
    assert other and other != small


# -- the scheduler's decision, replayed or shared


class _Extern:
    name = "extern_mm"  # an ATen kernel: never a fusion candidate


class _Template:
    """A GEMM's MultiTemplateBuffer as speedup_by_fusion uses it: three Triton choices
    (ranked by unfused time) and an extern one, the fastest."""

    def __init__(self) -> None:
        self.choices = []
        for name in ("triton_mm_a", "triton_mm_b", "triton_mm_c"):
            caller = object.__new__(TritonTemplateCaller)  # only its name matters here
            caller.name = name
            self.choices.append(caller)
        self.extern = _Extern()
        self._choice_timings = {None: {self.extern: 0.9, self.choices[0]: 1.0,
                                       self.choices[1]: 1.1, self.choices[2]: 1.2}}
        self.make_kernel_render = None
        self.finalized: Any = None
        self.swapped: list[Any] = []

    def choice_timings(self, hint_override: Any = None) -> dict[Any, float]:
        return self._choice_timings[hint_override]

    def get_min_choice(self) -> tuple[Any, float]:
        timings = self.choice_timings()
        best = min(timings, key=lambda c: timings[c])
        return best, timings[best]

    @contextlib.contextmanager
    def swap_as_triton_caller(self, caller: Any) -> Any:
        self.swapped.append(caller.name)
        yield

    def finalize_as_triton_caller(self, caller: Any) -> None:
        self.finalized = caller.name
        self.make_kernel_render = caller.name


@pytest.fixture
def fusing_db(tmp_path) -> str:
    """The database of the fusing fixture (tests/test_trust_decisions.py runs it on both
    backends)."""
    return str(tmp_path / "tune.db")


@pytest.fixture
def fusing(tmp_path, monkeypatch, fusing_db):
    """tunecache enabled with Triton sharing on a SQLite file; .decide(tokens, fused_ms)
    runs the wrapped speedup_by_fusion on one site, whose Inductor decision times the
    epilogue (0.5 ms) and then fuses candidates with the given timings."""
    from torch._inductor.codegen.triton import TritonScheduling

    timed: dict[str, float] = {}

    def benchmark(self: Any, mod: Any, n_spills_threshold: int = 8, node_names: Any = None
                  ) -> tuple[float, str]:
        return timed[mod.__file__], mod.__file__

    monkeypatch.setattr(TritonScheduling, "benchmark_codegened_module", benchmark)

    def open_cache(decisive: bool | str) -> tunecache.TuneCache:
        # True/"1": every part decisive; False/"0": none; else the parts listed.
        parts = {"gemm", "triton", "fusion"} if decisive in (True, "1") else \
            set() if decisive in (False, "0") else set(str(decisive).split(","))
        cache = tunecache.open(fusing_db,
                               levers=tunecache.Levers(decisive=frozenset(parts)))
        assert tunecache.enable(cache)
        tunecache.reset_stats()
        return cache

    state = SimpleNamespace(cache=open_cache(False), inductor_calls=0)

    def module(name: str, ms: float) -> Any:
        path = tmp_path / "modules" / f"{name}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"# {name}\n")
        timed[str(path)] = ms
        return SimpleNamespace(__file__=str(path))

    def decide(tokens: int, fused_ms: list[float], *, generates: bool = True,
               name: str = "site") -> tuple[bool, _Template]:
        template = _Template()
        site = FusionSite(template, ["gemm", "epilogue"], _key(tokens), _sizes(tokens))
        monkeypatch.setattr(decision_replay, "fusion_site", lambda sched, n1, n2: site)

        def generate(nodes: Any, benchmark_kernel: bool) -> str:
            if not generates:
                raise RuntimeError("CantSplit")
            return "source"

        scheduler = SimpleNamespace(generate_kernel_code_from_nodes=generate)

        def inductors(self: Any, node1: Any, node2: Any) -> Any:
            """speedup_by_fusion's benchmarked path, as Inductor runs it."""
            state.inductor_calls += 1
            ms1 = template.get_min_choice()[1]
            ms2, _ = TritonScheduling.benchmark_codegened_module(
                self, module(f"{name}-{tokens}-epilogue", 0.5))
            ranked = decision_replay._ranked_choices(template)

            def benchmark_when_ready() -> bool:
                timings = {}
                for choice, ms in zip(ranked, fused_ms):
                    timings[choice], _ = TritonScheduling.benchmark_codegened_module(
                        self, module(f"{name}-{tokens}-{choice.name}", ms))
                best = min(timings, key=lambda c: timings[c])
                if timings[best] < ms1 + ms2:
                    template.finalize_as_triton_caller(best)
                    template._choice_timings[None] = timings
                    return True
                return False

            return FusionResult.from_callable(benchmark_when_ready)

        wrapped = decision_replay._sharing_speedup_by_fusion(inductors)
        result = wrapped(scheduler, "gemm", "epilogue")
        fused = result.should_fuse if result.callable_fn is None else result.callable_fn()
        return fused, template

    def reopen(decisive: bool | str) -> None:
        tunecache.disable()
        state.cache.close()
        state.cache = open_cache(decisive)

    state.decide, state.reopen = decide, reopen
    try:
        yield state
    finally:
        tunecache.disable()
        state.cache.close()


def _stats() -> tuple[int, int, int]:
    s = tunecache.stats().triton.as_dict()
    return (s["fusion_decisions_replayed"], s["fusion_decisions_decided"],
            s["fusion_decisions_adopted"])


def test_inductors_decision_is_published_as_the_sites_entry(fusing):
    fused, template = fusing.decide(4096, [1.0, 1.3, 1.4])
    assert fused and template.finalized == "triton_mm_a"
    stored = decisions.stored_decision(fusing.cache, _key(4096))
    # unfused: the extern GEMM (0.9) and the epilogue alone (0.5)
    assert stored == Decision(1.4, 1.0, 1.3, 0)


@pytest.mark.parametrize("decisive", ["1", "fusion"])
def test_a_stored_decision_is_replayed_without_generating_compiling_or_timing(fusing,
                                                                              decisive):
    fusing.decide(4096, [1.6, 1.2, 2.0])  # the second candidate wins, fused
    fusing.reopen(decisive=decisive)
    calls = fusing.inductor_calls
    fused, template = fusing.decide(4096, [9.0, 9.0, 9.0], name="changed-graph")
    assert fused and template.finalized == "triton_mm_b"
    assert template.swapped == ["triton_mm_b"]  # its code generated once, as a check
    assert fusing.inductor_calls == calls
    assert _stats() == (1, 0, 0)


def test_a_stored_decision_not_to_fuse_is_replayed(fusing):
    fusing.decide(4096, [1.6, 1.8, 2.0])  # 1.6 > 0.9 + 0.5: no fusion
    fusing.reopen(decisive=True)
    calls = fusing.inductor_calls
    fused, template = fusing.decide(4096, [0.1, 0.1, 0.1], name="changed-graph")
    assert not fused and template.finalized is None
    assert fusing.inductor_calls == calls and template.swapped == []


@pytest.mark.parametrize("decisive", ["0", "gemm,triton"])
def test_without_decisive_a_stored_decision_is_timed_by_inductor_as_before(fusing, decisive):
    fusing.decide(4096, [1.0])
    fusing.reopen(decisive=decisive)
    calls = fusing.inductor_calls
    fusing.decide(4096, [1.0], name="changed-graph")
    assert fusing.inductor_calls == calls + 1
    assert _stats() == (0, 0, 0)


def test_neighbours_decide_a_new_size_with_decisive_on(fusing):
    for tokens in (8192, 16384):
        fusing.decide(tokens, [1.0, 1.3])
    fusing.reopen(decisive=True)
    calls = fusing.inductor_calls
    fused, template = fusing.decide(4096, [5.0, 5.0])
    assert fused and template.finalized == "triton_mm_a"
    assert fusing.inductor_calls == calls
    assert _stats() == (1, 1, 0)


def test_a_decided_candidate_whose_code_does_not_generate_is_left_to_inductor(fusing):
    fusing.decide(4096, [1.0, 1.3])
    fusing.reopen(decisive=True)
    calls = fusing.inductor_calls
    fused, template = fusing.decide(4096, [1.0, 1.3], generates=False, name="other")
    assert fusing.inductor_calls == calls + 1
    assert fused and template.finalized == "triton_mm_a"  # Inductor's own benchmarks
    assert _stats() == (0, 0, 0)


def test_a_rank_that_fused_adopts_a_peers_decision_not_to(fusing):
    peer = tunecache.open(fusing.cache.settings.db_url)
    try:
        decisions.settle(peer, _key(4096), STAYS, _sizes(4096))
    finally:
        peer.close()
    fused, template = fusing.decide(4096, [1.0, 1.3])
    assert not fused
    # As Inductor left the template before its benchmark: unfused timings, no render.
    assert template.make_kernel_render is None
    assert template.choice_timings()[template.extern] == 0.9
    assert _stats() == (0, 0, 1)


def test_a_rank_adopts_the_candidate_a_peer_fused(fusing):
    peer = tunecache.open(fusing.cache.settings.db_url)
    try:
        decisions.settle(peer, _key(4096), Decision.of(1.4, [1.0, 1.2], rank=2),
                         _sizes(4096))
    finally:
        peer.close()
    fused, template = fusing.decide(4096, [1.0, 1.3, 1.35])
    assert fused and template.finalized == "triton_mm_c"
    assert _stats() == (0, 0, 1)
