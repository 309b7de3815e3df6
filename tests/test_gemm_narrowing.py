"""A GEMM whose key is stored generates only the Triton template choices that can win
(tunecache/inductor/narrow.py).

The CPU wheel has no Triton, and on CPU Inductor's GEMM lowerings pass only extern
kernels (ATen) through ``get_template_configs`` (the C++ templates are added outside it),
so a real compile never narrows here; tests/test_inductor.py's real compiles run with the
hooks installed and still pick identical winners and outputs. These tests drive Inductor's
real ``InductorChoices.get_template_configs`` (its passes: KernelTemplateChoice
generators, ``_finalize_template_configs``, the layout fix, generation) with a real
``TritonTemplate`` whose generation is faked (it needs Triton and a graph) and records each
choice it generates, and with Inductor's real ``aten_mm`` extern kernel. The key is
Inductor's ``create_inputs_key`` of real ``ir.Buffer`` inputs, and the entries are in a
real SQLite database.
"""

from __future__ import annotations

import itertools
import logging
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor import ir  # noqa: E402
from torch._inductor.choices import InductorChoices  # noqa: E402
from torch._inductor.kernel.mm import aten_mm  # noqa: E402
from torch._inductor.kernel_template_choice import KernelTemplateChoice  # noqa: E402
from torch._inductor.select_algorithm import TritonTemplate, TritonTemplateCaller, create_inputs_key  # noqa: E402
from torch._inductor.sizevars import SizeVarAllocator  # noqa: E402
from torch._inductor.template_heuristics.params import DictKernelTemplateParams  # noqa: E402
from torch._inductor.virtualized import V  # noqa: E402

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402
from tunecache import keys as tc_keys  # noqa: E402
from tunecache.inductor.transfer import gemm_family  # noqa: E402

NAME = "tunecache_test_mm"
# Six configs, as a Triton mm heuristic yields them.
CONFIGS = [dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=32, GROUP_M=8, EVEN_K=True,
                ACC_TYPE="tl.float32", ALLOW_TF32=False, num_stages=s, num_warps=4)
           for m, n, s in [(32, 32, 2), (64, 32, 3), (64, 64, 3), (128, 64, 4),
                           (128, 128, 4), (32, 64, 5)]]
FASTEST = 3  # CONFIGS[3] gets the best stored timing


def _template() -> TritonTemplate:
    existing = TritonTemplate.all_templates.get(NAME)
    return existing if existing is not None else TritonTemplate(
        name=NAME, grid=lambda *args: (1, 1, 1), source="{{def_kernel('A', 'B')}}")


def inductors_description(kwargs: dict[str, Any]) -> str:
    """The description TritonTemplate.generate_and_load writes for these kwargs, as a
    GPU job logs it, e.g. "ACC_TYPE='tl.float32', ALLOW_TF32=False, BLOCK_K=32, ...,
    num_stages=2, num_warps=4" (torch 2.13, Triton without warp specialization)."""
    meta = {k: v for k, v in kwargs.items()
            if k not in ("num_stages", "num_warps", "layout", "input_nodes",
                         "generate_with_caching")}
    fields = [f"{k}={v!r}" for k, v in sorted(meta.items())]
    fields += [f"num_stages={kwargs['num_stages']}", f"num_warps={kwargs['num_warps']}"]
    return ", ".join(fields)


@pytest.fixture
def gemm_db(tmp_path) -> str:
    """The database the gemm fixture's entries are in (tests/test_trust_decisions.py
    runs it on both backends)."""
    return str(tmp_path / "tune.db")


@pytest.fixture
def gemm(gemm_db, monkeypatch):
    """tunecache enabled; .compile(with_aten) runs get_template_configs for one mm and
    returns its choices; .generated lists the Triton configs generated."""
    template = _template()
    generated: list[dict[str, Any]] = []
    counter = itertools.count()
    tweak = SimpleNamespace(description=inductors_description)

    def generate(**kwargs: Any) -> TritonTemplateCaller:
        generated.append({k: kwargs[k] for k in CONFIGS[0]})  # the config part
        caller = object.__new__(TritonTemplateCaller)  # only name and description matter
        caller.name = f"triton_{NAME}_{next(counter)}"
        caller.description = tweak.description(kwargs)
        return caller

    monkeypatch.setattr(template, "generate", generate)  # this instance only
    device = torch.device("cpu")

    def mm_nodes(m: int) -> list[ir.Buffer]:
        return [ir.Buffer(name="arg0", layout=ir.FixedLayout(device, torch.float32, [m, 32],
                                                             [32, 1])),
                ir.Buffer(name="arg1", layout=ir.FixedLayout(device, torch.float32, [32, 48],
                                                             [48, 1]))]

    nodes = mm_nodes(64)
    out = ir.FixedLayout(device, torch.float32, [64, 48], [48, 1])
    kernel_inputs = SimpleNamespace(nodes=lambda: nodes, device_type="cpu",
                                    output_layout=lambda flexible=True: out)

    def resize(m: int) -> None:
        """The same mm at another M: a new key of the same family (transfer.py)."""
        nodes[:] = mm_nodes(m)

    def get_ktc(self, kernel_inputs, tmpl, op_name, kwarg_overrides=None):
        cs = [{}] if tmpl is aten_mm else CONFIGS
        return (KernelTemplateChoice(tmpl, DictKernelTemplateParams(dict(c)), {}, out,
                                     kernel_inputs) for c in cs)

    monkeypatch.setattr(InductorChoices, "get_ktc", get_ktc)  # Inductor's heuristics
    graph = SimpleNamespace(sizevars=SizeVarAllocator(), buffer_layout_constraints={})
    # Decisive off: most tests here are about the plan; the decisive fixture turns it on.
    cache = tunecache.open(gemm_db, levers="-decisive_gemm,-decisive_fusion")
    assert tunecache.enable(cache)
    tunecache.reset_stats()

    def compile(with_aten: bool = True) -> list[Any]:
        templates = [aten_mm, template] if with_aten else [template]
        with V.set_graph_handler(graph), inductor_config.patch(max_autotune=True):
            return InductorChoices().get_template_configs(kernel_inputs, templates, "mm")

    def key() -> dict[str, Any]:
        with V.set_graph_handler(graph):
            inputs = create_inputs_key(nodes)
        return tc_inductor.make_key("mm", inputs, None, "cpu")

    def tune(choices: list[Any], skip: int | None = None, fastest: int = FASTEST,
             aten_ms: float = 0.5) -> dict[str, float]:
        """What the tuning job stores for these choices: CONFIGS[fastest] in 0.1 ms, aten
        in ``aten_ms``, the other templates in 1 ms and more."""
        ids = tc_inductor.candidate_ids(choices)
        timings = {}
        for i, cid in enumerate(ids):
            if cid.startswith("extern:"):
                timings[cid] = aten_ms
            else:
                n = next(j for j, c in enumerate(CONFIGS) if tc_inductor.candidate_id(
                    choices[i]).endswith(inductors_description(c)))
                timings[cid] = 0.1 if n == fastest else 1.0 + n
        if skip is not None:
            del timings[ids[skip]]
        # with its family, as the lookup hook stores a key it tunes
        cache.get_or_tune(tc_keys.Key.of(key(), family=gemm_family(key())), lambda: timings)
        return timings

    try:
        yield SimpleNamespace(compile=compile, tune=tune, generated=generated, tweak=tweak,
                              key=key, cache=cache, resize=resize)
    finally:
        tunecache.disable()
        cache.close()


def _stats() -> tuple[int, int, int, int]:
    s = tunecache.stats().gemm.as_dict()
    return (s["choice_lists_narrowed"], s["choices_not_generated"],
            s["choice_lists_in_full"], s["narrowing_mismatches"])


def test_a_miss_generates_every_template_choice(gemm):
    choices = gemm.compile()
    assert len(gemm.generated) == len(CONFIGS) and len(choices) == len(CONFIGS) + 1
    assert _stats() == (0, 0, 1, 0)


def test_a_stored_gemm_generates_only_its_fastest_template_and_keeps_aten(gemm):
    stored = gemm.tune(gemm.compile())
    gemm.generated.clear()
    tunecache.reset_stats()
    choices = gemm.compile()  # the next job: its key is a hit
    assert gemm.generated == [CONFIGS[FASTEST]]
    ids = tc_inductor.candidate_ids(choices)
    assert [i.split(":")[0] for i in ids] == ["extern", "triton"]
    # The selector then picks, from stored timings, what the tuning job picked.
    assert min(ids, key=stored.__getitem__) == tc_keys.best_candidate(stored)
    assert _stats() == (1, len(CONFIGS) - 1, 0, 0)


def test_the_fastest_stored_extern_kernel_stays_the_winner(gemm):
    choices = gemm.compile()
    ids = tc_inductor.candidate_ids(choices)
    timings = {i: (0.01 if i.startswith("extern:") else 2.0 + n) for n, i in enumerate(ids)}
    gemm.cache.get_or_tune(gemm.key(), lambda: timings)
    gemm.generated.clear()
    choices = gemm.compile()
    kept = tc_inductor.candidate_ids(choices)
    assert tc_keys.best_candidate(timings) in kept and len(gemm.generated) == 1


def test_without_an_extern_kernel_two_templates_stay_so_fusion_is_still_benchmarked(gemm):
    # One choice alone would make AlgorithmSelectorCache return it without a
    # MultiTemplateBuffer, and the epilogue-fusion benchmark would not run.
    gemm.tune(gemm.compile(with_aten=False))
    gemm.generated.clear()
    choices = gemm.compile(with_aten=False)
    # the fastest and the next by stored timing, in Inductor's list order
    assert len(choices) == 2 and gemm.generated == [CONFIGS[0], CONFIGS[FASTEST]]


def test_epilogue_benchmarked_choices_are_all_kept(gemm):
    gemm.tune(gemm.compile())
    gemm.generated.clear()
    with inductor_config.patch(max_epilogue_benchmarked_choices=3):
        choices = gemm.compile()
    # the fastest, then the next two by stored timing, in Inductor's list order
    assert len(choices) == 4 and gemm.generated == [CONFIGS[0], CONFIGS[1], CONFIGS[FASTEST]]


def test_a_template_missing_from_the_entry_generates_every_choice(gemm):
    gemm.tune(gemm.compile(), skip=2)  # a config this compile has and nobody timed
    gemm.generated.clear()
    gemm.compile()
    assert len(gemm.generated) == len(CONFIGS)
    assert _stats()[0] == 0


def test_a_kept_template_that_comes_out_different_generates_all_and_stops_narrowing(
        gemm, caplog):
    gemm.tune(gemm.compile())
    gemm.generated.clear()
    gemm.tweak.description = lambda kwargs: inductors_description(kwargs) + ", new=1"
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        choices = gemm.compile()
    assert len(choices) == len(CONFIGS) + 1  # generated again, in full
    assert len(gemm.generated) == 1 + len(CONFIGS)
    assert sum("describes them differently" in r.getMessage() for r in caplog.records) == 1
    gemm.generated.clear()
    gemm.compile()
    assert len(gemm.generated) == len(CONFIGS)  # off for the rest of the process
    assert _stats()[3] == 1


def test_disable_restores_inductors_choice_methods(tmp_path):
    own = (InductorChoices.__dict__["get_template_configs"],
           InductorChoices.__dict__["_finalize_template_configs"])
    cache = tunecache.open(str(tmp_path / "tune.db"))
    assert tunecache.enable(cache)
    try:
        assert InductorChoices.__dict__["get_template_configs"] is not own[0]
    finally:
        tunecache.disable()
        cache.close()
    assert (InductorChoices.__dict__["get_template_configs"],
            InductorChoices.__dict__["_finalize_template_configs"]) == own


def test_a_miss_next_to_a_recorded_size_generates_only_the_transferred_templates(gemm):
    gemm.tune(gemm.compile())  # M=64, tuned in full: CONFIGS[FASTEST] fastest, then 0, 1, ...
    gemm.generated.clear()
    tunecache.reset_stats()
    gemm.resize(128)  # a new key, one octave away
    choices = gemm.compile()
    # the neighbour's four fastest templates (transfer.FROM_NEAREST), and aten
    assert sorted(map(str, gemm.generated)) == sorted(
        map(str, [CONFIGS[FASTEST], CONFIGS[0], CONFIGS[1], CONFIGS[2]]))
    assert len(choices) == 5
    stats = tunecache.stats().gemm.as_dict()
    assert stats["choice_lists_transferred"] == 1
    assert stats["choice_lists_in_full"] == 0


def test_a_miss_without_a_near_size_generates_every_template(gemm):
    gemm.tune(gemm.compile())
    gemm.generated.clear()
    gemm.resize(64 * 16)  # four octaves away: no neighbour
    gemm.compile()
    assert len(gemm.generated) == len(CONFIGS)
    assert tunecache.stats().gemm.as_dict()["choice_lists_transferred"] == 0


def test_with_transfer_off_a_miss_next_to_a_recorded_size_generates_every_template(gemm):
    gemm.tune(gemm.compile())
    gemm.generated.clear()
    with tunecache.open(gemm.cache.settings.db_url, share="-transfer") as cache:
        assert tunecache.enable(cache)  # transfer not shared
        gemm.resize(128)
        gemm.compile()
    assert len(gemm.generated) == len(CONFIGS)


@pytest.fixture
def decisive(gemm):
    """The gemm fixture with every decisive lever on (``.active``: its cache)."""
    with tunecache.open(gemm.cache.settings.db_url, levers="+decisive_triton") as cache:
        gemm.active = cache
        yield gemm


def _recorded_at(gemm: Any, sizes: list[int], **tuning: Any) -> None:
    """The mm tuned in full at these M (each compile generating every choice), then set
    to M=128, a new key between them, with the fixture's cache enabled again."""
    with tunecache.open(gemm.cache.settings.db_url, share="-transfer") as recording:
        assert tunecache.enable(recording)
        for m in sizes:
            gemm.resize(m)
            gemm.tune(gemm.compile(), **tuning)
    assert tunecache.enable(getattr(gemm, "active", gemm.cache))
    gemm.generated.clear()
    tunecache.reset_stats()
    gemm.resize(128)


def test_a_miss_whose_neighbours_picked_one_template_by_far_generates_only_it(decisive):
    _recorded_at(decisive, [64, 256])  # CONFIGS[FASTEST] 5x faster than aten at both
    choices = decisive.compile()
    assert decisive.generated == [CONFIGS[FASTEST]]
    assert len(choices) == 1, "one choice: Inductor takes it without a benchmark"
    assert tunecache.stats().gemm.as_dict()["choice_lists_decided"] == 1


def test_decisive_without_its_gemm_part_keeps_the_transfer_plan(gemm):
    with tunecache.open(gemm.cache.settings.db_url,
                        levers="decisive_triton,decisive_fusion,compile_ahead") as cache:
        gemm.active = cache
        _recorded_at(gemm, [64, 256])  # as where the decisive GEMM generates only one
        gemm.compile()
    assert len(gemm.generated) > 1
    stats = tunecache.stats().gemm.as_dict()
    assert stats["choice_lists_decided"] == 0 and stats["choice_lists_transferred"] == 1


def test_a_miss_whose_neighbours_picked_aten_by_far_generates_no_template(decisive):
    _recorded_at(decisive, [64], aten_ms=0.01)
    choices = decisive.compile()
    assert decisive.generated == [] and len(choices) == 1


def test_neighbours_that_disagree_leave_the_transfer_plan(decisive):
    _recorded_at(decisive, [64])
    _recorded_at(decisive, [256], fastest=0)
    decisive.compile()
    assert len(decisive.generated) > 1
    stats = tunecache.stats().gemm.as_dict()
    assert stats["choice_lists_decided"] == 0 and stats["choice_lists_transferred"] == 1


def test_a_winner_within_the_margin_leaves_the_transfer_plan(decisive):
    _recorded_at(decisive, [64], aten_ms=0.1 * 1.1)  # aten 10% behind the winner
    decisive.compile()
    assert len(decisive.generated) > 1
    assert tunecache.stats().gemm.as_dict()["choice_lists_decided"] == 0


def test_a_decision_is_published_as_the_keys_entry_with_nothing_benchmarked(decisive):
    _recorded_at(decisive, [64, 256])
    decisive.compile()
    answer = decisive.cache.lookup(decisive.key())
    assert answer is not None
    (decided,) = answer.timings
    assert decided.endswith(inductors_description(CONFIGS[FASTEST]))
    assert answer.timings[decided] == 0.1  # the nearest neighbour's time for it
    assert answer.meta["transfer"]["benchmarked"] == 0
    assert answer.meta["transfer"]["generated"] == 1


def test_a_rank_whose_neighbours_no_longer_agree_runs_the_decision_a_peer_published(
        decisive):
    _recorded_at(decisive, [64])
    decisive.compile()  # the first rank decides CONFIGS[FASTEST] and publishes it
    # Another rank of the job, after a recording at 256 that picked another template:
    # on its own it would not decide, and would benchmark the plan.
    _recorded_at(decisive, [256], fastest=0)
    with tunecache.open(decisive.cache.settings.db_url, levers="+decisive_triton") as rank:
        assert tunecache.enable(rank)
        decisive.compile()
    # The decision is its entry: the decided template is the only one generated (the
    # ATen kernel stays, timed inf by the transferred entry), nothing is benchmarked.
    assert decisive.generated == [CONFIGS[FASTEST]]
    stats = tunecache.stats().gemm.as_dict()
    assert stats["choice_lists_decided"] == 0 and stats["choice_lists_transferred"] == 0


def test_a_key_a_peer_has_claimed_is_not_decided_but_follows_the_plan(decisive):
    _recorded_at(decisive, [64, 256])
    key = tc_keys.Key.of(decisive.key(), family=gemm_family(decisive.key()))
    with tunecache.open(decisive.cache.settings.db_url) as peer:
        claim = peer.claim(key, lease_seconds=600)
        assert claim is not None and not isinstance(claim, tunecache.Result)
        decisive.compile()
        assert len(decisive.generated) == 4  # the plan's templates, for the lookup
        stats = tunecache.stats().gemm.as_dict()
        assert stats["choice_lists_decided"] == 0 and stats["choice_lists_transferred"] == 1
        peer.release(claim, "test over", failed=False)


def test_a_decision_that_fails_to_publish_leaves_the_key_unclaimed_and_generates_all(
        decisive, monkeypatch, caplog):
    _recorded_at(decisive, [64, 256])

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(type(decisive.active), "publish", failing)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        decisive.compile()
    assert len(decisive.generated) == len(CONFIGS)  # as without tunecache
    assert not decisive.cache.in_progress(decisive.key())  # peers do not wait
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "disk full" in warnings[0].getMessage()


def test_with_TUNECACHE_DECISIVE_0_a_clear_winner_is_benchmarked_with_the_plan(gemm):
    _recorded_at(gemm, [64, 256])
    gemm.compile()
    assert len(gemm.generated) == 4  # transfer.FROM_NEAREST
    assert tunecache.stats().gemm.as_dict()["choice_lists_decided"] == 0


def test_by_default_a_clear_winner_is_decided(gemm, monkeypatch):
    monkeypatch.delenv("TUNECACHE_LEVERS", raising=False)
    with tunecache.open(gemm.cache.settings.db_url) as cache:
        gemm.active = cache
        _recorded_at(gemm, [64, 256])
        gemm.compile()
    assert gemm.generated == [CONFIGS[FASTEST]]
    assert tunecache.stats().gemm.as_dict()["choice_lists_decided"] == 1


@pytest.mark.parametrize("first", ["torch._inductor.choices", "torch._inductor.select_algorithm"])
def test_narrowing_comes_on_whichever_inductor_module_a_job_imports_first(tmp_path, first):
    # torch._inductor.choices imports select_algorithm while it is only half initialised:
    # a job (or a custom InductorChoices subclass) that imports it first once turned
    # narrowing off with a circular-import warning.
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["TUNECACHE_DB"] = str(tmp_path / "tune.db")
    code = (f"import torch, importlib\nimportlib.import_module({first!r})\n"
            "import torch._inductor.choices, torch._inductor.select_algorithm\n"
            "import json\nfrom tunecache.switch import parts_on\nprint(json.dumps(parts_on()))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert {"gemm", "narrowing"} <= set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "tunecache" not in done.stderr, done.stderr
