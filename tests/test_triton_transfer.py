"""Transfer for Triton kernels: a kernel whose coordinate descent this process is to run
starts from the stored results of the same kernel at other sizes (its family), benchmarks
them against the config the descent would start from and keeps the fastest, without the
descent.

Inductor's own ``CachingAutotuner.run`` -> ``autotune_to_one_config`` ->
``coordinate_descent_tuning`` (and its CoordescTuner) run here on the CPU, with Triton's
compile, launch and ``bench`` faked (tests/triton_fake_autotuner.py), on kernel modules
Inductor 2.11 generated for one llama-style block for a Hopper GPU (sm_90) at 1000, 1024,
2048 and 4096 tokens, and on an H200 for tools/bench_gpu.py's models at 4096 and 8192
tokens (tests/data/triton_kernels; ``benchmarked_*``: a module compiled to time an
epilogue alone, with its benchmark harness).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tool_modules import TOOLS  # noqa: E402
from torch._inductor.runtime import autotune_cache as ac  # noqa: E402
from torch._inductor.runtime import triton_heuristics as th  # noqa: E402
from triton_fakes import FakeConfig, TritonConfig, meta  # noqa: E402

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402
from tunecache.inductor.state import REGISTRY  # noqa: E402
from tunecache.inductor.triton.compile_ahead import THREAD_NAME  # noqa: E402
from tunecache.inductor.triton.kernel_keys import (  # noqa: E402
    size_distance,
    triton_kernel_info,
    triton_key,
)
from tunecache.keys import Key, key_hash  # noqa: E402

KERNELS = Path(__file__).resolve().parent / "data" / "triton_kernels"
SILU = "triton_poi_fused_mul_silu_3"
TRANSPOSE = "triton_poi_fused__unsafe_view_add_clone_transpose_4"
SOFTMAX = "triton_red_fused__softmax__to_copy_amax_mul_sub_2"


def source(name: str, tokens: int, index: int = 0) -> str:
    """A kernel module Inductor generated, as it is on GPU ``index``."""
    text = (KERNELS / f"{name}_{tokens}.txt").read_text()
    return text.replace("index=0,", f"index={index},")


# ------------------------------------------------------------------- the family


@pytest.mark.parametrize("name, sizes", [
    (SILU, (1000, 1024, 2048, 4096)),
    (TRANSPOSE, (1000, 1024, 2048, 4096)),  # a stride spans the tokens: 131072*(x0 // 128)
    ("triton_poi_fused_add_cat_mul_slice_sub_view_1", (1000, 1024, 2048, 4096)),
    (SOFTMAX, (2048, 4096)),  # add_persistent_rblock appears at 4096
    # masks: 8192's r0_mask is constant, 4096's compares
    ("triton_red_fused_sum", (4096, 8192)),
    # a mean over the whole tensor: 1/numel is a float constant of the computation
    ("triton_poi_fused__to_copy_add_mean_sub", (4096, 8192)),
    ("triton_red_fused__to_copy_add_div_expand_neg_sum", (4096, 8192)),
    # the harness's shapes and numel
    ("benchmarked_mul_silu", (4096, 8192)),
    # 1000 tokens: the softmax rows need masks, and with them the select of max's identity
    ("triton_per_fused__softmax__to_copy_amax_mul_sub_2", (1000, 1024)),
])
def test_the_same_kernel_at_other_token_counts_is_one_family(name, sizes):
    infos = [triton_kernel_info(source(name, t, index=i % 2), {}) for i, t in enumerate(sizes)]
    assert len({i["family"] for i in infos}) == 1
    assert len({i["kernel"] for i in infos}) == len(sizes)  # each size its own key


def test_different_kernels_are_different_families():
    families = {triton_kernel_info(source(name, 2048), {})["family"]
                for name in (SILU, TRANSPOSE, SOFTMAX,
                             "triton_poi_fused_add_cat_mul_slice_sub_view_1")}
    assert len(families) == 4
    # Another operation is another kernel, where a constant is not.
    base = source(SILU, 2048)
    assert "tmp5 = tmp3 + tmp4" in base
    other = base.replace("tmp5 = tmp3 + tmp4", "tmp5 = tmp3 * tmp4")
    assert triton_kernel_info(other, {})["family"] != triton_kernel_info(base, {})["family"]
    # Masks are blanked, not dropped: a load guarded by a computed condition stays so.
    masked = base.replace("tl.load(in_ptr0 + (x0), None", "tl.load(in_ptr0 + (x0), tmp0 & xmask")
    assert masked != base
    assert triton_kernel_info(masked, {})["family"] != triton_kernel_info(base, {})["family"]


def test_a_mix_order_reduction_is_not_the_family_of_the_reductions_it_replaces():
    # At 8192 tokens Inductor fuses a norm's backward over rows and over columns into
    # one kernel (rows >= 2 x columns); at 4096 it does not: other kernels, other configs.
    a = triton_kernel_info(
        (KERNELS / "mix_order_reduction_out_of_place.txt").read_text(), {})
    b = triton_kernel_info(source("triton_red_fused__to_copy_add_div_expand_neg_sum", 4096), {})
    assert a["family"] != b["family"]


def test_family_and_sizes_leave_the_key_hash_as_it_was():
    info = triton_kernel_info(source(SILU, 2048), {})
    assert info["sizes"] == {"x": 8388608}
    without = {k: v for k, v in info.items() if k not in ("family", "sizes")}
    assert key_hash(triton_key("ik", info)) == key_hash(triton_key("ik", without))
    assert "family" not in triton_key("ik", info) and "sizes" not in triton_key("ik", info)


def test_sizes_more_than_two_octaves_away_are_not_neighbours():
    assert size_distance({"x": 1024}, {"x": 4096}) == 2.0
    assert size_distance({"x": 1024}, {"x": 8192}) is None
    assert size_distance({"x": 1024, "r0_": 64}, {"x": 1024}) is None
    for hostile in (None, [], {"x": "1024"}, {"x": -1}, {"x": True}, {"x": 1e300}):
        assert size_distance({"x": 1024}, hostile) is None


# ------------------------------------------------------ transfer at the first run

# Where the faked benchmark is fastest: each octave away from it costs 1 ms, each octave
# of num_warps away from 4 costs 0.25 ms.
BEST_XBLOCK = 256


def fake_ms(cfg: Any) -> float:
    return 1.0 + abs(math.log2(cfg.kwargs["XBLOCK"] / BEST_XBLOCK)) \
        + 0.25 * abs(math.log2(cfg.num_warps / 4))


class Timed:
    """The faked ``bench``: records what it measured."""

    def __init__(self) -> None:
        self.benched: list[Any] = []

    def __call__(self, kernel: Any, launcher: Any, *args: Any, **kwargs: Any) -> float:
        self.benched.append(launcher.config)
        return fake_ms(launcher.config)


def _configs(tokens: int) -> list[FakeConfig]:
    # The heuristic's configs differ by size (so does their hash): XBLOCK capped by it.
    top = 1024 if tokens >= 2048 else 512
    return [FakeConfig(4, XBLOCK=64), FakeConfig(8, XBLOCK=top)]


@pytest.fixture
def transfer(tmp_path, monkeypatch, request):
    """tunecache enabled (on ``db_url`` where a test asks for it), and a loader of real
    kernel modules onto a CachingAutotuner whose Triton is faked."""
    import triton_fake_autotuner as fa

    monkeypatch.setattr(ac, "Config", TritonConfig)  # triton.Config; no triton on the CPU
    monkeypatch.setattr(fa, "FAILS_TO_COMPILE", [])
    monkeypatch.setattr(fa, "FAILS_TO_LAUNCH", [])
    timed = Timed()
    monkeypatch.setattr(fa.FakeAutotuner, "bench", lambda self, launcher, *a, **k:
                        timed(self, launcher, *a, **k), raising=False)
    descents: list[Any] = []
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

    inductors_autotune = CoordescTuner.autotune

    def autotune(self, *args, **kwargs):
        descents.append(self)
        return inductors_autotune(self, *args, **kwargs)

    monkeypatch.setattr(CoordescTuner, "autotune", autotune)
    db = request.getfixturevalue("db_url") if "db_url" in request.fixturenames \
        else str(tmp_path / "tune.db")
    cache = tunecache.open(db)
    assert tunecache.enable(cache)
    tunecache.reset_stats()

    def load(name: str, tokens: int, index: int = 0) -> Any:
        path = tmp_path / f"{name}-{tokens}-{index}" / "kernel.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source(name, tokens, index))
        return _load_autotuner(fa, str(path), _configs(tokens))

    def key(kernel: Any) -> Any:
        autotune_cache = kernel.save_cache_hook.__self__
        return tc_inductor.triton_key(autotune_cache.remote_cache_full_key,
                                      json.loads(autotune_cache.remote_cache[1]))

    def first_run(kernel: Any) -> Any:
        """AsyncCompile's precompile, then run(): autotune_to_one_config and coordinate
        descent; what the run launched."""
        kernel.precompile()
        timed.benched.clear()
        descents.clear()
        kernel.run("arg", stream=0)
        return kernel.launched[-1]

    try:
        yield SimpleNamespace(cache=cache, load=load, key=key, first_run=first_run,
                              timed=timed, descents=descents, fa=fa)
    finally:
        tunecache.disable()
        cache.close()


def _load_autotuner(fa: Any, filename: str, configs: list[FakeConfig]) -> Any:
    """fa.load_autotuner with coordinate descent on and a kernel function Inductor's
    descent can log (``fn.src``)."""
    from torch._inductor.runtime.hints import DeviceProperties, HeuristicType

    def kernel(in_out_ptr0: Any, in_ptr0: Any, xnumel: Any, XBLOCK: Any) -> None:
        pass

    fn = SimpleNamespace(fn=kernel, __name__="triton_poi_fused_mul_silu_3", src="src")
    triton_meta = {"device": DeviceProperties.create(torch.device("cpu")), "signature": {}}
    m = {**meta(coordesc=True, name=fn.__name__)}
    return th.cached_autotune({"x": 1024}, configs, triton_meta, HeuristicType.POINTWISE,
                              filename=filename, inductor_meta=m,
                              caching_autotuner_cls=fa.FakeAutotuner)(fn)


def _entry(cache: Any, key: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the stored best config, the entry's meta)."""
    answer = cache.lookup(key)
    assert answer is not None
    (best,) = answer.timings
    return json.loads(best), dict(answer.meta)


def _record(transfer: Any, tokens: int = 1024) -> Any:
    """The silu kernel at ``tokens``, tuned by Inductor's full descent and stored."""
    k = transfer.load(SILU, tokens)
    ran = transfer.first_run(k)
    assert ran.kwargs["XBLOCK"] == BEST_XBLOCK and transfer.descents
    return k


def test_a_new_kernel_next_to_a_recorded_one_starts_from_its_config_without_descent(
        transfer, db_url):
    recorded = _record(transfer, 1024)
    best, _ = _entry(transfer.cache, transfer.key(recorded))
    tunecache.reset_stats()
    k = transfer.load(SILU, 2048, index=1)  # another size, another GPU
    ran = transfer.first_run(k)
    assert (ran.kwargs, ran.num_warps) == ({"XBLOCK": best["XBLOCK"]}, best["num_warps"])
    assert transfer.descents == []  # no coordinate descent
    # The starting config and the neighbour's: two benchmarks, nothing else.
    assert len(transfer.timed.benched) == 2
    stats = REGISTRY.triton_stats
    assert (stats.coordesc_transferred, stats.coordesc_full, stats.transfer_benchmarks) == (
        1, 0, 2)
    stored, entry_meta = _entry(transfer.cache, transfer.key(k))
    assert stored["found_by_coordesc"] is True and stored["XBLOCK"] == BEST_XBLOCK
    timed = entry_meta["transfer"].pop("timed")
    assert entry_meta["transfer"] == {"from": [key_hash(transfer.key(recorded))[0]],
                                      "benchmarked": 2, "generated": 2}
    # Each config it timed, with its time: the start config's and the neighbour's.
    assert timed == [{"config": {**c.kwargs, "num_warps": c.num_warps,
                                 "num_stages": c.num_stages}, "ms": fake_ms(c)}
                     for c in transfer.timed.benched]
    fastest = min(timed, key=lambda t: t["ms"])
    assert fastest["config"]["XBLOCK"] == BEST_XBLOCK
    assert entry_meta["best_ms"] == fake_ms(ran)
    assert entry_meta["baseline"]["candidate"] == "heuristic"
    assert entry_meta["baseline"]["ms"] >= entry_meta["best_ms"]
    assert entry_meta["sizes"] == {"x": 8388608}
    # Later loads adopt it exactly as a descent's result: a hit, no tuning.
    again = transfer.load(SILU, 2048, index=0)
    assert again.autotune_cache_info["autotune_cache_state"] == "hit"


def test_a_kernel_with_no_recorded_neighbour_runs_the_full_descent(transfer, db_url):
    k = transfer.load(SILU, 2048)
    transfer.first_run(k)
    assert len(transfer.descents) == 1
    stats = REGISTRY.triton_stats
    assert (stats.coordesc_transferred, stats.coordesc_full) == (0, 1)


def test_a_neighbour_whose_descent_ended_at_this_kernels_start_config_ends_its_tuning(
        transfer, monkeypatch):
    # Fastest at XBLOCK 1024 with 8 warps: at 1024 tokens the descent climbs from 512 to
    # 1024, which is where the kernel at 2048 tokens starts.
    monkeypatch.setitem(globals(), "fake_ms", lambda cfg: 1.0 + abs(
        math.log2(cfg.kwargs["XBLOCK"] / 1024)) + 0.25 * abs(math.log2(cfg.num_warps / 8)))
    recorded = transfer.load(SILU, 1024)
    transfer.first_run(recorded)
    best, _ = _entry(transfer.cache, transfer.key(recorded))
    assert (best["XBLOCK"], best["num_warps"]) == (1024, 8) and transfer.descents
    tunecache.reset_stats()
    k = transfer.load(SILU, 2048, index=1)
    ran = transfer.first_run(k)
    assert (ran.kwargs, ran.num_warps) == ({"XBLOCK": 1024}, 8)
    assert transfer.descents == []
    stats = REGISTRY.triton_stats
    assert (stats.coordesc_transferred, stats.coordesc_full, stats.transfer_benchmarks) == (
        1, 0, 1)
    stored, entry_meta = _entry(transfer.cache, transfer.key(k))
    assert stored["found_by_coordesc"] is True and stored["XBLOCK"] == 1024
    assert entry_meta["transfer"] == {
        "from": [key_hash(transfer.key(recorded))[0]], "benchmarked": 1, "generated": 1,
        "timed": [{"config": {"XBLOCK": 1024, "num_warps": 8, "num_stages": 1},
                   "ms": fake_ms(ran)}]}


def test_a_transferred_kernels_entry_tells_what_its_neighbours_config_cost_here(
        transfer, monkeypatch):
    _record(transfer, 1024)  # the descent found XBLOCK 256, 4 warps
    # At 2048 the config the descent starts from (XBLOCK 1024, 8 warps) is fastest, and
    # the neighbour's takes 3.25 times as long.
    monkeypatch.setitem(globals(), "fake_ms", lambda cfg: 1.0 + abs(
        math.log2(cfg.kwargs["XBLOCK"] / 1024)) + 0.25 * abs(math.log2(cfg.num_warps / 8)))
    ran = transfer.first_run(transfer.load(SILU, 2048, index=1))
    assert (ran.kwargs["XBLOCK"], ran.num_warps) == (1024, 8) and transfer.descents == []
    tool = TOOLS / "decisive_regret.py"
    done = subprocess.run([sys.executable, str(tool), transfer.cache.settings.db_url,
                           "--json"], check=True, capture_output=True, text=True, timeout=120)
    (row,) = json.loads(done.stdout)["would_decide"]
    assert (row["kind"], row["verdict"]) == ("triton_config", "agree")
    assert row["regret"] == pytest.approx(3.25)


def test_a_neighbour_more_than_two_octaves_away_is_not_used(transfer):
    _record(transfer, 1000)  # x = 4194304
    tunecache.reset_stats()
    transfer.first_run(transfer.load(SILU, 4096))  # x = 16777216: 2 octaves, used
    assert transfer.descents == []
    assert tunecache.stats().triton.coordesc_transferred == 1


def test_a_different_kernel_is_not_a_neighbour(transfer):
    _record(transfer, 1024)
    tunecache.reset_stats()
    k = transfer.load(TRANSPOSE, 2048)  # another family (same configs, same sizes)
    transfer.first_run(k)
    assert len(transfer.descents) == 1
    assert tunecache.stats().triton.coordesc_transferred == 0


def test_a_neighbour_config_that_fails_to_compile_falls_back_with_one_warning(
        transfer, caplog):
    _record(transfer, 1024)
    transfer.fa.FAILS_TO_COMPILE.append(lambda cfg: cfg.kwargs.get("XBLOCK") == BEST_XBLOCK)
    tunecache.reset_stats()
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        k = transfer.load(SILU, 2048)
        ran = transfer.first_run(k)
    # Nothing of the neighbours' could run: the full descent, which cannot have 256 here.
    assert len(transfer.descents) == 1 and ran.kwargs["XBLOCK"] != BEST_XBLOCK
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "tunecache" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "neighbour" in warnings[0], warnings
    stats = REGISTRY.triton_stats
    assert (stats.transfer_failed, stats.coordesc_full, stats.coordesc_transferred) == (1, 1, 0)


def test_transfer_off_runs_the_full_descent(transfer, monkeypatch):
    _record(transfer, 1024)
    tunecache.disable()
    transfer.cache.close()
    monkeypatch.setenv("TUNECACHE_SHARE", "-transfer")
    transfer.cache = tunecache.open(transfer.cache.settings.db_url)
    assert not transfer.cache.settings.shares("transfer")
    assert tunecache.enable(transfer.cache)
    tunecache.reset_stats()
    k = transfer.load(SILU, 2048)
    transfer.first_run(k)
    assert len(transfer.descents) == 1
    stats = REGISTRY.triton_stats
    assert (stats.coordesc_transferred, stats.coordesc_full, stats.transfer_benchmarks) == (
        0, 1, 0)


def test_candidates_compiled_ahead_in_threads_change_nothing_descent_or_transfer_decide(
        transfer, tmp_path, monkeypatch, compiles_started):
    compiled_in: dict[str, list[str]] = {}
    faked_compile = transfer.fa.FakeAutotuner._precompile_config

    def compile_recording_thread(self: Any, cfg: Any) -> Any:
        compiled_in.setdefault(threading.current_thread().name, []).append(cfg)
        return faked_compile(self, cfg)

    monkeypatch.setattr(transfer.fa.FakeAutotuner, "_precompile_config",
                        compile_recording_thread)
    faked_bench = transfer.fa.FakeAutotuner.bench

    def bench(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> float:
        ms = faked_bench(self, launcher, *args, **kwargs)
        compiles_started.wait()
        return ms

    monkeypatch.setattr(transfer.fa.FakeAutotuner, "bench", bench)

    def descent_then_transfer() -> list[tuple[Any, list[Any]]]:
        """What a full descent at 1024 tokens, then transfer at 2048, ran and measured."""
        return [((ran := transfer.first_run(transfer.load(SILU, tokens, index))).kwargs,
                 ran.num_warps, [(c.kwargs, c.num_warps) for c in transfer.timed.benched])
                for tokens, index in ((1024, 0), (2048, 1))]

    def reopen(name: str, threads: int) -> None:
        tunecache.disable()
        transfer.cache.close()
        transfer.cache = tunecache.open(str(tmp_path / name),
                                        levers=tunecache.Levers(compile_ahead=threads))
        assert tunecache.enable(transfer.cache)
        tunecache.reset_stats()
        compiled_in.clear()

    reopen("plain.db", 0)
    plain = descent_then_transfer()
    assert set(compiled_in) == {threading.current_thread().name}
    reopen("ahead.db", 2)
    assert descent_then_transfer() == plain
    # What both stored, as tools/triton_config_diff.py compares two GPU jobs' databases.
    listings = []
    for name in ("plain.db", "ahead.db"):
        listing = tmp_path / f"{name}.json"
        listing.write_text(subprocess.run(
            [sys.executable, "-m", "tunecache.cli", "ls", "--json", "--kind", "triton_config",
             "--db", str(tmp_path / name)],
            check=True, capture_output=True, text=True, timeout=120).stdout)
        listings.append(str(listing))
    tool = TOOLS / "triton_config_diff.py"
    diff = json.loads(subprocess.run([sys.executable, str(tool), *listings, "--json"],
                                     check=True, capture_output=True, text=True,
                                     timeout=120).stdout)
    assert (diff["compared"], diff["same"]) == (2, 2)
    # and each kernel's tuning seconds, as the listing gives them
    assert all(s["a"] is not None and s["b"] is not None for s in diff["seconds"])
    stats = REGISTRY.triton_stats
    assert (stats.coordesc_full, stats.coordesc_transferred) == (1, 1)
    compiles_started.join_threads()
    ahead = [c for name, cs in compiled_in.items() if name.startswith(THREAD_NAME)
             for c in cs]
    # Taken from a thread: the neighbour's config in transfer (started before the start
    # config's benchmark), and in the descent at least the start config's neighbours
    # after the first (the first is compiled wherever it starts first).
    assert stats.served_ahead >= 2
    assert stats.served_ahead <= stats.compiled_ahead == len(ahead)


def test_a_full_descent_entry_records_its_baseline_and_best_time(transfer, db_url):
    k = _record(transfer, 1024)
    stored, entry_meta = _entry(transfer.cache, transfer.key(k))
    start = _configs(1024)[-1]  # the faked configs' benchmark picks the last
    assert entry_meta["baseline"] == {"candidate": "heuristic", "ms": fake_ms(start)}
    assert entry_meta["best_ms"] == 1.0 and stored["XBLOCK"] == BEST_XBLOCK
    assert entry_meta["sizes"] == {"x": 4194304} and "transfer" not in entry_meta


def test_the_family_is_stored_with_the_claim(transfer):
    k = _record(transfer, 1024)
    other = transfer.load(SILU, 2048)
    family = triton_kernel_info(source(SILU, 2048), {"coordinate_descent_tuning": True})["family"]
    found = transfer.cache.neighbours(Key.of(transfer.key(other), family=family))
    assert [n.key_hash for n in found] == [key_hash(transfer.key(k))[0]]


# --------------------------------- decided by neighbours that agree (decisive levers)


def _reopen(loaded: Any, monkeypatch: Any, env: dict[str, str]) -> None:
    """The cache of ``loaded`` (the ``transfer`` fixture) opened again with these
    TUNECACHE_* settings."""
    tunecache.disable()
    loaded.cache.close()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    loaded.cache = tunecache.open(loaded.cache.settings.db_url)
    assert tunecache.enable(loaded.cache)


@pytest.fixture
def decisive(transfer, monkeypatch):
    """``transfer`` with every decisive lever on."""
    _reopen(transfer, monkeypatch, {"TUNECACHE_LEVERS": "+decisive_triton"})
    assert "triton" in transfer.cache.settings.levers.decisive
    return transfer


def _record_in_full(transfer: Any, monkeypatch: Any, sizes: dict[int, int]) -> None:
    """The silu kernel at each token count tuned by Inductor's full descent (transfer off)
    where the given XBLOCK is fastest; then the cache as ``transfer`` had it."""
    settings = transfer.cache.settings
    _reopen(transfer, monkeypatch, {"TUNECACHE_SHARE": "-transfer",
                                    "TUNECACHE_LEVERS": "-decisive_gemm,-decisive_fusion"})
    for tokens, best_xblock in sizes.items():
        monkeypatch.setitem(globals(), "BEST_XBLOCK", best_xblock)
        ran = transfer.first_run(transfer.load(SILU, tokens))
        assert ran.kwargs["XBLOCK"] == best_xblock and transfer.descents
    monkeypatch.setitem(globals(), "BEST_XBLOCK", BEST_XBLOCK)
    _reopen(transfer, monkeypatch, {
        "TUNECACHE_SHARE": ",".join(sorted(settings.share)) or "gemm",
        "TUNECACHE_LEVERS": ",".join(sorted(settings.levers.names)) or "-compile_ahead"})


def test_a_kernel_whose_neighbours_agree_loads_their_config_alone_and_measures_nothing(
        decisive, db_url):
    recorded = _record(decisive, 1024)
    tunecache.reset_stats()
    k = decisive.load(SILU, 2048, index=1)
    # The load already has the one config: a compile worker compiles only it.
    assert k.autotune_cache_info["autotune_cache_state"] == "hit"
    assert [c.kwargs["XBLOCK"] for c in k.configs] == [BEST_XBLOCK]
    ran = decisive.first_run(k)
    assert ran.kwargs["XBLOCK"] == BEST_XBLOCK
    assert decisive.descents == [] and decisive.timed.benched == []  # nothing measured
    stats = REGISTRY.triton_stats
    assert (stats.coordesc_decided, stats.coordesc_transferred, stats.coordesc_full) == (1, 0, 0)
    # Published under the claim, as a descent's result: every later load is a plain hit.
    stored, entry_meta = _entry(decisive.cache, decisive.key(k))
    assert stored["found_by_coordesc"] is True and stored["XBLOCK"] == BEST_XBLOCK
    assert entry_meta["transfer"] == {"from": [key_hash(decisive.key(recorded))[0]],
                                      "benchmarked": 0, "generated": 1}
    # A second run launches; it decides nothing again.
    k.run("arg", stream=0)
    assert stats.coordesc_decided == 1 and decisive.timed.benched == []


def test_neighbours_that_disagree_decide_nothing_and_transfer_measures(decisive, monkeypatch):
    _record_in_full(decisive, monkeypatch, {1024: 256, 4096: 512})
    tunecache.reset_stats()
    k = decisive.load(SILU, 2048)
    assert k.autotune_cache_info["autotune_cache_state"] == "miss"
    decisive.first_run(k)
    stats = REGISTRY.triton_stats
    assert (stats.coordesc_decided, stats.coordesc_transferred) == (0, 1)
    assert stats.transfer_benchmarks == 3  # the starting config and both neighbours'


def test_a_neighbour_that_was_itself_decided_decides_nothing(decisive, db_url):
    _record(decisive, 1024)
    decisive.first_run(decisive.load(SILU, 4096))  # decided by 1024: nothing measured
    assert tunecache.stats().triton.coordesc_decided == 1
    # 2048's nearest are 1024 (tuned in full) and 4096 (not): a miss, then transfer.
    k = decisive.load(SILU, 2048)
    assert k.autotune_cache_info["autotune_cache_state"] == "miss"


def test_a_neighbour_whose_own_key_is_of_another_kind_of_kernel_decides_nothing(
        decisive, db_url):
    """The family column is the row writer's; the row's own key must say the kernel's
    heuristic, environment and tag are this kernel's."""
    from sqlalchemy import text

    recorded = _record(decisive, 1024)
    planted = {**decisive.key(recorded), "heuristic": "reduction"}
    decisive.cache.store.db.run(lambda c: c.execute(
        text("UPDATE tunecache_entries SET key_json = :k WHERE key_hash = :h"),
        {"k": json.dumps(planted), "h": key_hash(decisive.key(recorded))[0]}), write=True)
    k = decisive.load(SILU, 2048, index=1)
    assert k.autotune_cache_info["autotune_cache_state"] == "miss"


@pytest.mark.parametrize("parts", ["-decisive_gemm,-decisive_fusion",
                                   "decisive_gemm,decisive_fusion"])
def test_decisive_without_its_triton_part_loads_no_neighbour_config(transfer, monkeypatch,
                                                                     parts):
    _reopen(transfer, monkeypatch, {"TUNECACHE_LEVERS": parts})
    _record(transfer, 1024)
    k = transfer.load(SILU, 2048)
    assert k.autotune_cache_info["autotune_cache_state"] == "miss"
    transfer.first_run(k)
    stats = REGISTRY.triton_stats
    assert (stats.coordesc_decided, stats.coordesc_transferred) == (0, 1)


def test_ranks_that_decided_differently_run_the_config_the_first_one_published(
        decisive, monkeypatch, db_url):
    _record_in_full(decisive, monkeypatch, {1024: 256})
    late = decisive.load(SILU, 2048, index=1)  # decided 256 from the one neighbour
    assert [c.kwargs["XBLOCK"] for c in late.configs] == [256]
    # Before the other rank loads, another size is recorded: the neighbours now disagree,
    # so that rank transfers (measures) and publishes first.
    _record_in_full(decisive, monkeypatch, {4096: 512})
    monkeypatch.setitem(globals(), "BEST_XBLOCK", 512)  # where 2048 is measured now
    first = decisive.first_run(decisive.load(SILU, 2048, index=0))
    assert first.kwargs["XBLOCK"] == 512
    tunecache.reset_stats()
    ran = decisive.first_run(late)
    assert (ran.kwargs, ran.num_warps) == (first.kwargs, first.num_warps)
    stats = REGISTRY.triton_stats
    assert (stats.coordesc_decided, stats.adopted) == (0, 1)


def test_a_decided_config_that_fails_to_compile_is_neither_run_nor_published(
        decisive, caplog):
    _record(decisive, 1024)
    decisive.fa.FAILS_TO_COMPILE.append(lambda cfg: cfg.kwargs.get("XBLOCK") == BEST_XBLOCK)
    tunecache.reset_stats()
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        k = decisive.load(SILU, 2048)
        ran = decisive.first_run(k)
    assert ran.kwargs["XBLOCK"] != BEST_XBLOCK
    stats = REGISTRY.triton_stats
    assert stats.coordesc_decided == 0 and stats.coordesc_full == 1
    _, entry_meta = _entry(decisive.cache, decisive.key(k))
    assert "transfer" not in entry_meta  # the descent's own result, not a decision


def test_two_processes_that_decide_one_kernel_at_once_publish_it_once_and_run_it(
        transfer, tmp_path):
    """Real processes on one SQLite file: both load the decided config, then reach the
    kernel's first run together; one claims and publishes it, the other adopts it (or
    runs it while the peer publishes)."""
    _record(transfer, 1024)
    tests = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tests.parent), str(tests),
                                                      env.get("PYTHONPATH")]))
    ranks = [subprocess.Popen(
        [sys.executable, str(tests / "triton_decided_worker.py"),
         transfer.cache.settings.db_url, str(tmp_path), str(i)],
        env={**env, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"inductor-{i}")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=240)
        assert rank.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["state"] for r in results] == ["hit", "hit"]
    assert results[0]["ran"] == results[1]["ran"] == [{"XBLOCK": BEST_XBLOCK}, 4]
    stats = [r["stats"] for r in results]
    assert sum(s["coordesc_decided"] for s in stats) == 1
    assert sum(s["published"] for s in stats) == 1
    assert all(s["coordesc_full"] == s["coordesc_transferred"] == 0 for s in stats)
    assert all(s["transfer_benchmarks"] == 0 for s in stats)


def test_a_decided_config_whose_publish_fails_is_tuned_as_without_it_with_one_warning(
        decisive, monkeypatch, caplog):
    _record(decisive, 1024)
    inductors_save = ac.AutotuneCache.save
    calls = []

    def save_failing_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise OSError("disk full")
        return inductors_save(self, *args, **kwargs)

    monkeypatch.setattr(ac.AutotuneCache, "save", save_failing_once)
    tunecache.reset_stats()
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        k = decisive.load(SILU, 2048)
        ran = decisive.first_run(k)
    assert ran.kwargs["XBLOCK"] == BEST_XBLOCK
    stats = REGISTRY.triton_stats
    # Then transfer, whose one neighbour config is the decided one it runs: kept, with no
    # descent.
    assert (stats.coordesc_decided, stats.coordesc_transferred, stats.coordesc_full) == (
        0, 1, 0)
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "tunecache" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "disk full" in warnings[0], warnings
    stored, _ = _entry(decisive.cache, decisive.key(k))
    assert stored["XBLOCK"] == BEST_XBLOCK


# ------------------------------------------------------------------- after an upgrade
OLD_TORCH = "2.10.0"


def _upgraded(transfer: Any, monkeypatch: Any, key: Any) -> None:
    """The stored entry of ``key`` rewritten as an older torch would have recorded it
    (its torch version, and Inductor's key of the kernel, which hashes torch's sources);
    then the cache opened again, as by a job started after the upgrade."""
    from sqlalchemy import text

    cache = transfer.cache
    old_hash = key_hash(key)[0]
    mapping = {**key, "env": {**key["env"], "torch": OLD_TORCH},
               "inductor_key": "older-" + key["inductor_key"]}
    new_hash, new_text = key_hash(mapping)
    cache.store.db.run(lambda c: c.execute(text(
        "UPDATE tunecache_entries SET key_hash = :n, key_json = :j, torch_version = :t "
        "WHERE key_hash = :o"), {"n": new_hash, "j": new_text, "t": OLD_TORCH, "o": old_hash}),
        write=True)
    _reopen(transfer, monkeypatch, {})


def test_after_an_upgrade_a_kernel_starts_from_its_own_old_result_without_descent(transfer,
                                                                             monkeypatch, db_url):
    recorded = _record(transfer, 1024)
    best, _ = _entry(transfer.cache, transfer.key(recorded))
    _upgraded(transfer, monkeypatch, transfer.key(recorded))
    tunecache.reset_stats()
    k = transfer.load(SILU, 1024, index=1)
    assert k.autotune_cache_info["autotune_cache_state"] != "hit"
    ran = transfer.first_run(k)
    assert (ran.kwargs, ran.num_warps) == ({"XBLOCK": best["XBLOCK"]}, best["num_warps"])
    assert transfer.descents == [] and len(transfer.timed.benched) == 2
    assert tunecache.stats().triton.coordesc_transferred == 1
    stored, entry_meta = _entry(transfer.cache, transfer.key(k))
    assert stored["XBLOCK"] == BEST_XBLOCK
    assert entry_meta["transfer"]["from_version"]["torch"] == OLD_TORCH
    assert entry_meta["transfer"]["benchmarked"] == 2
    again = transfer.load(SILU, 1024, index=0)
    assert again.autotune_cache_info["autotune_cache_state"] == "hit"


def test_after_an_upgrade_an_old_record_at_other_sizes_or_of_another_kernel_is_no_source(
        transfer, monkeypatch):
    recorded = _record(transfer, 1024)
    _upgraded(transfer, monkeypatch, transfer.key(recorded))
    tunecache.reset_stats()
    transfer.first_run(transfer.load(SILU, 2048))  # the same kernel at another size
    transfer.first_run(transfer.load(TRANSPOSE, 1024))  # another kernel
    assert len(transfer.descents) == 1  # each first_run clears them: the last one's
    assert tunecache.stats().triton.coordesc_transferred == 0
    assert tunecache.stats().triton.coordesc_full == 2


def test_after_an_upgrade_an_old_record_that_is_no_descent_result_is_no_source(transfer,
                                                                             monkeypatch):
    from sqlalchemy import text

    recorded = _record(transfer, 1024)
    _upgraded(transfer, monkeypatch, transfer.key(recorded))
    planted = json.dumps({json.dumps({"XBLOCK": 2048, "num_warps": 4, "num_stages": 1}): 0.5})
    transfer.cache.store.db.run(lambda c: c.execute(text(
        "UPDATE tunecache_entries SET timings_json = :t WHERE torch_version = :old"),
        {"t": planted, "old": OLD_TORCH}), write=True)
    tunecache.reset_stats()
    transfer.first_run(transfer.load(SILU, 1024, index=1))
    assert len(transfer.descents) == 1
    assert tunecache.stats().triton.coordesc_transferred == 0
