"""Transfer: a GEMM key nobody tuned benchmarks only the best candidates of the recorded
keys of its structure nearest in size (tunecache/inductor/transfer.py).

The lookup hook is driven with Inductor's real selector and fake candidates (as in
tests/test_inductor.py): Triton template callers whose identity is a template name and a
config, an extern kernel, and a benchmark callable that records what it was asked to
time. Keys are Inductor-style ``inputs_key`` strings, so families and sizes are real.
Two real processes compiling real CPU GEMMs check that ranks agree on a transferred winner.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import inductor_fakes as fakes  # noqa: E402
from torch._inductor import ir  # noqa: E402

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402
from tunecache.inductor import transfer  # noqa: E402

HERE = Path(__file__).resolve().parent


class FakeTemplate(ir.TritonTemplateCallerBase):
    """A Triton template candidate: its identity is the template name and config."""

    def __init__(self, n: int, block_k: int = 32) -> None:
        super().__init__(f"triton_mm_{n}", [], fakes.CPU_LAYOUT, (  # type: ignore[arg-type]
            f"ACC_TYPE='tl.float32', ALLOW_TF32=False, BLOCK_K={block_k}, BLOCK_M={16 << n}, "
            f"EVEN_K=True, GROUP_M=8, num_stages={2 + n % 3}, num_warps=4"))

    def hash_key(self) -> str:
        return f"source-hash-{self.name}-{self.description}"


def inputs_key(m: int, k: int = 64, n: int = 48, transposed: bool = False) -> str:
    a = ("cpu", "torch.float32", m, k, 1, m, 0) if transposed else \
        ("cpu", "torch.float32", m, k, k, 1, 0)
    return repr([a, ("cpu", "torch.float32", k, n, n, 1, 0)])


def choices() -> list[Any]:
    # Eight templates and the extern kernel, as Inductor lists them.
    return [fakes.FakeChoice("aten"), *(FakeTemplate(i) for i in range(8))]


def times(fastest: list[int], aten: float = 1.0) -> dict[str, float]:
    """Template i's time by its rank in ``fastest`` (others slow)."""
    out = {"aten": aten}
    for i in range(8):
        out[f"triton_mm_{i}"] = 0.1 * (fastest.index(i) + 1) if i in fastest else 2.0 + i
    return out


def timings_by_name(found: dict[Any, float]) -> dict[str, float]:
    return {c.name: t for c, t in found.items()}


@pytest.fixture(autouse=True)
def _own_inductor_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


@pytest.fixture
def hooked(db_url):
    tunecache.reset_stats()
    assert tunecache.enable(db=db_url)
    yield db_url
    tunecache.disable()
    tunecache.reset_stats()


def rehook(url: str, **settings: Any) -> None:
    """A new process's view: nothing read yet, the same database."""
    tunecache.disable()
    assert tunecache.enable(db=url, **settings)


def record_neighbour(calls: list[list[str]], m: int = 1024,
                     fastest: list[int] | None = None) -> None:
    """A key tuned in full at M=m (nothing near it is recorded yet)."""
    bench = fakes.fake_benchmark(calls, times(fastest or [5, 2, 7, 0, 3]))
    fakes.lookup(choices(), "mm", inputs_key(m), bench)
    assert sorted(calls[-1]) == sorted(c.name for c in choices())  # in full


def entry_meta(url: str, m: int, **key: Any) -> dict[str, Any]:
    with tunecache.open(url) as cache:
        found = cache.lookup(tc_inductor.make_key("mm", inputs_key(m, **key), None, "cpu"))
    assert found is not None
    return dict(found.meta)


def test_a_new_key_next_to_a_recorded_one_benchmarks_only_its_best_templates_and_aten(hooked):
    calls: list[list[str]] = []
    record_neighbour(calls)
    rehook(hooked)
    bench = fakes.fake_benchmark(calls, times([2, 5, 0, 7, 3]))
    found = timings_by_name(fakes.lookup(choices(), "mm", inputs_key(2048), bench))
    # the neighbour's four fastest templates (FROM_NEAREST) and the extern kernel
    assert sorted(calls[1]) == sorted(["aten", "triton_mm_5", "triton_mm_2", "triton_mm_7",
                                       "triton_mm_0"])
    assert min(found, key=found.__getitem__) == "triton_mm_2"
    assert math.isinf(found["triton_mm_3"])  # not benchmarked: never the winner here
    meta = entry_meta(hooked, 2048)
    assert meta["transfer"]["benchmarked"] == 5 and meta["transfer"]["generated"] == 9
    assert len(meta["transfer"]["from"]) == 1 and meta["best_ms"] == pytest.approx(0.1)
    assert tunecache.stats().gemm.as_dict()["transferred_keys"] == 1


def test_a_key_with_no_neighbour_of_its_structure_is_tuned_in_full(hooked):
    calls: list[list[str]] = []
    record_neighbour(calls)
    rehook(hooked)
    bench = fakes.fake_benchmark(calls, times([1]))
    fakes.lookup(choices(), "mm", inputs_key(2048, transposed=True), bench)  # another family
    assert len(calls[1]) == 9
    fakes.lookup(choices(), "mm", inputs_key(1024 * 16), bench)  # four octaves away
    assert len(calls[2]) == 9
    assert "transfer" not in entry_meta(hooked, 1024 * 16)


def test_when_no_transferred_template_runs_the_key_is_tuned_in_full_with_one_warning(
        hooked, caplog):
    calls: list[list[str]] = []
    record_neighbour(calls)
    rehook(hooked)
    failing = {**times([1]), **{f"triton_mm_{i}": math.inf for i in (5, 2, 7, 0)}}
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        found = timings_by_name(fakes.lookup(choices(), "mm", inputs_key(2048),
                                             fakes.fake_benchmark(calls, failing)))
    assert sorted(calls[2]) == ["triton_mm_1", "triton_mm_3", "triton_mm_4", "triton_mm_6"]
    assert min(found, key=found.__getitem__) == "triton_mm_1"
    assert len([r for r in caplog.records if "no transferred candidate" in r.message]) == 1
    assert "transfer" not in entry_meta(hooked, 2048)


def test_with_transfer_off_a_new_key_is_tuned_in_full(hooked):
    calls: list[list[str]] = []
    record_neighbour(calls)
    rehook(hooked, share="-transfer")
    fakes.lookup(choices(), "mm", inputs_key(2048), fakes.fake_benchmark(calls, times([1])))
    assert len(calls[1]) == 9


def test_a_later_job_takes_the_transferred_entry_as_it_is(hooked):
    calls: list[list[str]] = []
    record_neighbour(calls)
    rehook(hooked)
    bench = fakes.fake_benchmark(calls, times([2, 5, 0, 7, 3]))
    first = timings_by_name(fakes.lookup(choices(), "mm", inputs_key(2048), bench))
    rehook(hooked)
    again = timings_by_name(fakes.lookup(choices(), "mm", inputs_key(2048), bench))
    assert len(calls) == 2  # no top-up of what the transfer left out
    assert again == first
    # and the precompile probe answers in full, so nothing is precompiled either
    probe = fakes.lookup(choices(), "mm", inputs_key(2048), None)
    assert timings_by_name(probe) == first


def test_an_exhaustive_top_up_is_merged_and_its_winner_taken(hooked):
    calls: list[list[str]] = []
    record_neighbour(calls)
    rehook(hooked)
    truth = times([6, 2, 5, 0, 7])  # at this size template 6 wins, and nobody near tuned it
    fakes.lookup(choices(), "mm", inputs_key(2048), fakes.fake_benchmark(calls, truth))
    rehook(hooked, share="-transfer")  # what `tunecache warm --exhaustive` does
    fakes.lookup(choices(), "mm", inputs_key(2048), fakes.fake_benchmark(calls, truth))
    assert sorted(calls[2]) == ["triton_mm_1", "triton_mm_3", "triton_mm_4", "triton_mm_6"]
    rehook(hooked)
    found = timings_by_name(fakes.lookup(choices(), "mm", inputs_key(2048),
                                         fakes.fake_benchmark(calls, truth)))
    assert len(calls) == 3 and min(found, key=found.__getitem__) == "triton_mm_6"


def test_a_plan_takes_the_nearest_neighbours_best_first_and_is_bounded():
    def neighbour(m: int, fastest: list[int], transferred: bool = False) -> Any:
        key = tc_inductor.make_key("mm", inputs_key(m), None, "cpu")
        ids = tc_inductor.candidate_ids(choices())
        t = {cid: ms for cid, ms in zip(ids, times(fastest).values())}
        meta = {"transfer": {}} if transferred else {}
        return tunecache.Neighbour(f"h{m}", key, t, meta)

    key = tc_inductor.make_key("mm", inputs_key(2048), None, "cpu")
    plan = transfer.plan_transfer(key, [neighbour(512, [1, 2, 3]), neighbour(4096, [7, 6, 5, 4]),
                                        neighbour(8192 * 16, [0])])
    assert plan is not None
    by_n = {transfer.transfer_id(i): c.name for i, c in
            zip(tc_inductor.candidate_ids(choices()), choices())}
    # the nearest (4096, one octave) gives four, the next (512, two octaves) two
    assert sorted(by_n[t] for t in plan.ids) == sorted(
        f"triton_mm_{i}" for i in (7, 6, 5, 4, 1, 2))
    assert plan.sources == ("h4096", "h512")
    assert len(plan.ids) <= transfer.MAX_TEMPLATES


def test_only_full_tunings_that_agree_by_the_margin_decide_a_winner():
    def neighbour(m: int, fastest: list[int], transferred: bool = False,
                  aten: float = 1.0) -> Any:
        key = tc_inductor.make_key("mm", inputs_key(m), None, "cpu")
        ids = tc_inductor.candidate_ids(choices())
        t = {cid: ms for cid, ms in zip(ids, times(fastest, aten).values())}
        return tunecache.Neighbour(f"h{m}", key, t, {"transfer": {}} if transferred else {})

    key = tc_inductor.make_key("mm", inputs_key(2048), None, "cpu")

    def winner(*neighbours: Any) -> str | None:
        plan = transfer.plan_transfer(key, list(neighbours), decisive=True)
        assert plan is not None
        return plan.winner

    by_id = {transfer.transfer_id(i): c.name for i, c in
             zip(tc_inductor.candidate_ids(choices()), choices())}
    # template 3 in 0.1 ms, the runner-up (aten) in 1 ms: by far
    assert by_id[winner(neighbour(1024, [3]), neighbour(4096, [3]))] == "triton_mm_3"
    assert winner(neighbour(1024, [3]), neighbour(4096, [5])) is None, "they disagree"
    assert winner(neighbour(1024, [3], aten=0.11)) is None, "aten 10% behind"
    assert winner(neighbour(1024, [3], aten=0.01)) is None, \
        "a winner of a kind matched across shapes by nothing (neither template nor ATen)"
    assert winner(neighbour(1024, [3]), neighbour(4096, [3], transferred=True)) is None, \
        "a transferred entry timed only what it kept"
    assert transfer.plan_transfer(key, [neighbour(1024, [3])]).winner is None, "off"


def test_a_family_leaves_out_sizes_but_not_layout_dtype_or_op():
    def family(op: str = "mm", **kw: Any) -> str | None:
        return transfer.gemm_family(tc_inductor.make_key(op, inputs_key(**kw), None, "cpu"))

    assert family(m=64) == family(m=8192) == family(m=64, k=4096, n=11)
    assert family(m=64) != family(m=64, transposed=True)
    assert family(m=64) != family(op="addmm", m=64)
    bf16 = inputs_key(64).replace("float32", "bfloat16")
    assert transfer.gemm_family(tc_inductor.make_key("mm", bf16, None, "cpu")) != family(m=64)
    assert transfer.gemm_family(tc_inductor.make_key("mm", "garbage(", None, "cpu")) is None


def test_a_template_matches_across_shapes_without_the_fields_the_shape_sets():
    a = "triton:triton_mm:ACC_TYPE='tl.float32', ALLOW_TF32=False, BLOCK_K=32, EVEN_K=True, " \
        "num_stages=2, num_warps=4"
    b = a.replace("EVEN_K=True", "EVEN_K=False").replace("ALLOW_TF32=False", "ALLOW_TF32=True")
    assert transfer.transfer_id(a) == transfer.transfer_id(b)
    assert transfer.transfer_id(a) != transfer.transfer_id(a.replace("BLOCK_K=32", "BLOCK_K=64"))
    assert transfer.transfer_id("CppTemplateCaller:CppMicroGemmFP32Vec-abc") == \
        transfer.transfer_id("CppTemplateCaller:CppMicroGemmFP32Vec-def")
    assert transfer.transfer_id("extern:mm-abc") is None


def _worker(tmp: Path, name: str, db: str, tokens: int, *extra: str) -> subprocess.Popen:
    # Decisive off: whether real CPU timings give a neighbour a decisive margin varies from
    # run to run, and these tests count what transfer measures.
    env = {**os.environ, "TUNECACHE_DB": db, "TUNECACHE_LEVERS": "-decisive_gemm,-decisive_fusion",
           "PYTHONPATH": os.pathsep.join(
               [str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"inductor-{name}")}
    return subprocess.Popen(
        [sys.executable, str(HERE / "inductor_worker.py"), "--ops", "bmm,linear",
         "--tokens", str(tokens), "--out", str(tmp / f"{name}.json"), *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "w"))


def _result(tmp: Path, name: str, proc: subprocess.Popen) -> dict[str, Any]:
    assert proc.wait(timeout=600) == 0, (tmp / f"{name}.log").read_text()[-3000:]
    return json.loads((tmp / f"{name}.json").read_text())


def test_two_processes_agree_on_a_transferred_winner_and_tune_each_key_once(tmp_path, db_url):
    first = _worker(tmp_path, "record", db_url, 32)
    _result(tmp_path, "record", first)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [_worker(tmp_path, f"p{i}", db_url, 64, "--barrier", str(barrier), "--parties", "2")
             for i in range(2)]
    results = [_result(tmp_path, f"p{i}", p) for i, p in enumerate(procs)]
    winners = [{e["key_hash"]: e["best"] for e in r["stats"]["events"] if e.get("best")}
               for r in results]
    assert winners[0] and winners[0] == winners[1]
    assert results[0]["outputs"] == results[1]["outputs"]
    tuned = sum(r["stats"]["transferred_keys"] for r in results)
    assert tuned == 2  # bmm and linear at the new size: each once, by one of the two
    assert sum(r["stats"]["benchmarks"] for r in results) == 2
    # every entry says what the untuned choice (the ATen kernel) took, and the winner
    with tunecache.open(db_url) as cache:
        metas = [dict(cache.lookup(json.loads(k)).meta) for k in _keys(cache)]
    assert len(metas) == 4 and all(m["baseline"]["candidate"].startswith("extern:")
                                   and m["best_ms"] <= m["baseline"]["ms"] for m in metas)
    assert sum("transfer" in m for m in metas) == 2


def _keys(cache: Any) -> list[str]:
    from sqlalchemy import select

    from tunecache.store.schema import entries

    return cache.store.db.run(lambda c: [r[0] for r in c.execute(
        select(entries.c.key_json).where(entries.c.kind == "gemm"))])


def test_a_process_looks_for_a_transferred_entrys_top_up_once(hooked, monkeypatch):
    calls: list[list[str]] = []
    record_neighbour(calls)
    rehook(hooked)
    bench = fakes.fake_benchmark(calls, times([2, 5, 0, 7, 3]))
    fakes.lookup(choices(), "mm", inputs_key(2048), bench)
    rehook(hooked)
    asked: list[Any] = []
    real = tunecache.TuneCache.lookup

    def counting(self: Any, key: Any) -> Any:
        asked.append(key)
        return real(self, key)

    monkeypatch.setattr(tunecache.TuneCache, "lookup", counting)
    for _ in range(3):  # the same GEMM lowered three times in one process
        fakes.lookup(choices(), "mm", inputs_key(2048), bench)
    top_ups = [k for k in asked
               if tunecache.keys.top_up_base(tunecache.keys.Key.of(k).mapping) is not None]
    assert len(top_ups) == 1 and len(calls) == 2


def test_one_distance_bounds_each_size_or_the_sum_and_refuses_what_is_not_a_size():
    from tunecache.keys import octaves_apart

    assert octaves_apart([4096, 64], [8192, 64]) == 1.0
    assert octaves_apart([4096, 64], [16384, 128], most_each=2.0) == 3.0
    assert octaves_apart([4096, 64], [32768, 64], most_each=2.0) is None  # one size, 3
    assert octaves_apart([4096, 64], [16384, 128], most_total=2.5) is None  # the sum, 3
    assert octaves_apart([4096, "float16"], [8192, "float16"]) == 1.0
    for theirs in ([4096, "bfloat16"], [4096], [0, 64], [-1, 64], [float("nan"), 64],
                   [float("inf"), 64], [True, 64], "4096"):
        assert octaves_apart([2048, 64], theirs) is None, theirs
