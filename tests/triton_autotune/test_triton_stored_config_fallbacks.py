"""tunecache.inductor's Triton section.

Hostile stored configs: refused with one warning, or fallen back from.

Triton is not installed on the CPU test machines: autotune_helpers.py says how these tests
drive Inductor's own autotune-cache code with fake configs.
"""

from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")

from autotune_helpers import (  # noqa: E402
    FINE_CONFIG,
    STORED_CONFIG,
    TUNED,
    broken_kernels,
    first_run,
    load,
    own_configs,
    plant,
    publish_as_peer,
    stored,
    warning_lines,
)
from torch._inductor.runtime import autotune_cache as ac  # noqa: E402
from triton_fakes import (  # noqa: E402
    FakeConfig,
    TritonConfig,
    configs,
    kernel_file,
    meta,
)

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402


@pytest.mark.parametrize("hostile, reason", [
    ({"num_warps": 64}, "num_warps"),  # CUDA: "invalid argument" at launch
    ({"XBLOCK": 1 << 20, "R0_BLOCK": 1 << 20}, "BLOCK"),  # a Triton CompilationError
    ({"XBLOCK": 8192}, "XBLOCK"),  # above Inductor's X limit
    ({"R0_BLOCK": 1 << 17}, "R0_BLOCK"),  # above Inductor's R0_ limit
    ({"EVIL": 4}, "not this kernel's"),  # an unknown constexpr: a Triton ValueError
    ({"num_ctas": 2}, "not this kernel's"),
    ({"R0_BLOCK": None}, "not this kernel's"),  # a constexpr the kernel needs is missing
    ({"XBLOCK": 0}, "XBLOCK"),
    ({"XBLOCK": -8}, "XBLOCK"),
    ({"R0_BLOCK": 48}, "R0_BLOCK"),
    ({"XBLOCK": "8"}, "XBLOCK"),
    ({"XBLOCK": 8.0}, "XBLOCK"),
    ({"XBLOCK": True}, "XBLOCK"),
    ({"num_warps": "4"}, "num_warps"),
    ({"num_warps": 12}, "num_warps"),
    ({"num_stages": 2.5}, "num_stages"),
    ({"num_stages": 1000}, "num_stages"),
    ({"num_stages": -1}, "num_stages"),
])
def test_a_stored_config_the_kernel_could_not_have_is_refused_with_one_warning(
    enabled, tmp_path, monkeypatch, caplog, hostile, reason
):
    monkeypatch.setattr(ac, "Config", TritonConfig)  # triton.Config; no triton on the CPU
    entry = {k: v for k, v in {**FINE_CONFIG, **hostile}.items() if v is not None}
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for body in ("tmp0 + tmp1", "tmp0 * tmp1", "tmp0 - tmp1"):
            plant(enabled, kernel_file(tmp_path, 0, body=body), meta(), entry, own_configs())
            cfgs, _, info = load(kernel_file(tmp_path, 1, body=body), meta(), own_configs())
            # As without an entry: Inductor tunes its own configs.
            assert info["autotune_cache_state"] == "miss"
            assert [c.kwargs for c in cfgs] == [c.kwargs for c in own_configs()]
    (warning,) = warning_lines(caplog)  # one per reason in a process, not one per kernel
    assert reason in warning and "refused" in warning, warning
    assert tunecache.stats().triton.invalid == 3 and tunecache.stats().triton.hits == 0
    # Left alone in the database, as any entry that fails validation.
    assert [r["state"] for r in stored(enabled)] == ["done"] * 3


def test_a_stored_config_with_another_lists_hash_is_no_hit_and_said_once(
    enabled, tmp_path, monkeypatch, caplog
):
    # Inductor itself drops it (its configs hash is not this kernel's): not a hit.
    monkeypatch.setattr(ac, "Config", TritonConfig)
    entry = {**FINE_CONFIG, "configs_hash": "another list"}
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for body in ("tmp0 + tmp1", "tmp0 * tmp1"):
            plant(enabled, kernel_file(tmp_path, 0, body=body), meta(), entry, own_configs())
            cfgs, _, info = load(kernel_file(tmp_path, 1, body=body), meta(), own_configs())
            assert info["autotune_cache_state"] == "miss"
            assert [c.kwargs for c in cfgs] == [c.kwargs for c in own_configs()]
    (warning,) = warning_lines(caplog)
    assert "configs hash" in warning and "refused" in warning, warning
    assert tunecache.stats().triton.invalid == 2 and tunecache.stats().triton.hits == 0


def test_a_config_outside_the_kernels_list_is_a_hit_only_where_this_torch_loads_it(
    enabled, tmp_path, monkeypatch, caplog
):
    # 2.13 rebuilds any stored config; 2.11 and 2.12 load none outside the kernel's own
    # list unless coordinate descent found it (with descent on): there it is no hit, and
    # tunecache says so once.
    monkeypatch.setattr(ac, "Config", TritonConfig)
    rebuilds = hasattr(ac, "_reconstruct_triton_config")
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        plant(enabled, kernel_file(tmp_path, 0), meta(), FINE_CONFIG, own_configs())
        cfgs, _, info = load(kernel_file(tmp_path, 1), meta(), own_configs())
    if rebuilds:
        assert info["autotune_cache_state"] == "hit" and warning_lines(caplog) == []
        assert cfgs[0].kwargs == {"XBLOCK": 16, "R0_BLOCK": 128}
        assert tunecache.stats().triton.hits == 1
    else:
        assert info["autotune_cache_state"] == "miss"
        (warning,) = warning_lines(caplog)
        assert "coordinate-descent" in warning and "refused" in warning, warning
        assert tunecache.stats().triton.hits == 0


def test_the_hostile_cases_are_refused_by_entry_validation():
    from tunecache.inductor.triton.kernel_keys import triton_config_problem

    for hostile in ({"num_warps": 64}, {"XBLOCK": 1 << 20}, {"R0_BLOCK": 1 << 20},
                    {"num_stages": 17}, {"XBLOCK": 2.0}, {"maxnreg": 1 << 20},
                    {"num_ctas": 3}, {"RSPLIT": 128}):
        entry = {**FINE_CONFIG, **hostile, "configs_hash": "h"}
        assert triton_config_problem(entry) is not None, hostile
        assert tc_inductor.triton_config_from_entry({json.dumps(entry): 1.0}) is None
    assert triton_config_problem({**FINE_CONFIG, "configs_hash": "h"}) is None


def test_a_config_without_xblock_fits_only_a_kernel_without_an_x_dimension():
    # cached_autotune drops XBLOCK (1 there) from such a kernel's configs, and a config
    # saved for it has none; a kernel that has an x dimension needs it.
    from tunecache.inductor.triton.kernel_keys import kernel_config_problem

    stored = TritonConfig({"R0_BLOCK": 256}, 4, 1)
    assert kernel_config_problem(stored, [FakeConfig(4, XBLOCK=1, R0_BLOCK=128)]) is None
    problem = kernel_config_problem(stored, [FakeConfig(4, XBLOCK=8, R0_BLOCK=128)])
    assert problem is not None and "not this kernel's" in problem


def test_tiny_blocks_32_warps_and_16_stages_are_still_used(enabled, tmp_path, monkeypatch,
                                                           caplog):
    # What ran correctly under Triton on CUDA: a coordinate-descent result may go below the
    # kernel's own configs (XBLOCK=1, R0_BLOCK=2) and up to 32 warps and 16 stages.
    monkeypatch.setattr(ac, "Config", TritonConfig)
    entry = {"num_warps": 32, "num_stages": 16, "XBLOCK": 1, "R0_BLOCK": 2,
             "found_by_coordesc": True}
    plant(enabled, kernel_file(tmp_path, 0), meta(coordesc=True), entry, own_configs())
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        cfgs, _, info = load(kernel_file(tmp_path, 1), meta(coordesc=True), own_configs())
    assert info["autotune_cache_state"] == "hit" and warning_lines(caplog) == []
    assert (cfgs[0].kwargs, cfgs[0].num_warps, cfgs[0].num_stages) == (
        {"XBLOCK": 1, "R0_BLOCK": 2}, 32, 16)


def test_a_stored_config_that_fails_to_compile_falls_back_to_inductors_tuning(
    broken, tmp_path, caplog
):
    broken.fa.FAILS_TO_COMPILE.append(lambda cfg: cfg.kwargs["XBLOCK"] == 1024)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for k in broken_kernels(broken, tmp_path):
            k.precompile()  # as AsyncCompile.triton does after loading the kernel
            # Inductor's own configs compiled and benchmarked; it picks the last one.
            assert k.run("arg", stream=0) == ("ran", {"XBLOCK": 64}, 2, ("arg",))
            assert [(c.kwargs, c.num_warps) for c in k.compiled] == [
                ({"XBLOCK": 1024}, 16), ({"XBLOCK": 128}, 4), ({"XBLOCK": 512}, 8),
                ({"XBLOCK": 64}, 2)]
    (warning,) = warning_lines(caplog)
    assert "compil" in warning and "FakeCompilationError" in warning, warning
    assert tunecache.stats().triton.stored_config_failed == 2
    assert [r["state"] for r in stored(broken.cache)] == ["done", "done"]


def test_a_stored_config_that_fails_to_launch_falls_back_to_inductors_tuning(
    broken, tmp_path, caplog
):
    broken.fa.FAILS_TO_LAUNCH.append(lambda cfg: cfg.kwargs["XBLOCK"] == 1024)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        for k in broken_kernels(broken, tmp_path):
            k.precompile()
            assert k.run("a", stream=0) == ("ran", {"XBLOCK": 64}, 2, ("a",))
            assert k.run("b", stream=0) == ("ran", {"XBLOCK": 64}, 2, ("b",))
            assert k.run("c", stream=0) == ("ran", {"XBLOCK": 64}, 2, ("c",))
            assert [c.kwargs["XBLOCK"] for c in k.launched] == [64, 64, 64]
            assert k.launchers[0].config.kwargs == {"XBLOCK": 64}
    (warning,) = warning_lines(caplog)
    assert "launch" in warning and "invalid argument" in warning, warning
    assert tunecache.stats().triton.stored_config_failed == 2


def test_a_stored_config_that_launches_is_launched_directly_after_its_first_run(
    broken, tmp_path
):
    (k,) = broken_kernels(broken, tmp_path, 1)
    k.precompile()
    for arg in "abc":
        assert k.run(arg, stream=0) == ("ran", {"XBLOCK": 1024}, 16, (arg,))
    # Nothing of tunecache's stays between the run and the stored config's launcher.
    assert type(k.launchers[0]) is broken.fa.FakeRunLauncher
    # (2.13 also keeps it for its fast path)
    assert type(vars(k).get("_cached_launcher", k.launchers[0])) is broken.fa.FakeRunLauncher


def test_a_kernel_that_fails_with_inductors_own_configs_too_raises_their_error(
    broken, tmp_path
):
    # Not the stored config's fault: the job fails as it would without tunecache, with
    # the error of Inductor's own config.
    broken.fa.FAILS_TO_LAUNCH.append(lambda cfg: True)
    (k,) = broken_kernels(broken, tmp_path, 1)
    k.precompile()
    with pytest.raises(RuntimeError, match=r"invalid argument \(\{'XBLOCK': 64\}\)"):
        k.run("a", stream=0)  # the launch of the config Inductor picked
    broken.fa.FAILS_TO_COMPILE.append(lambda cfg: True)
    (k,) = broken_kernels(broken, tmp_path, 1, first=1)
    with pytest.raises(broken.fa.FakeCompilationError, match=r"\{'XBLOCK': 128\}"):
        k.precompile()  # the compile of Inductor's first config


def test_a_stored_config_that_fails_to_compile_in_a_compile_worker_falls_back_there(
    tmp_path, monkeypatch
):
    """A real Inductor compile worker (SubprocPool): it compiles Inductor's own configs
    instead, and the kernel goes back to the compiling process as a miss."""
    import functools

    import triton_fake_autotuner as fa
    from torch._inductor.compile_worker.subproc_pool import SubprocPool

    db = str(tmp_path / "tune.db")
    monkeypatch.setenv("TUNECACHE_DB", db)
    monkeypatch.setenv("TUNECACHE_SHARE", "+triton")
    monkeypatch.delenv("TUNECACHE_MODE", raising=False)
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    assert tunecache.enable()
    pool = SubprocPool(1)
    try:
        with tunecache.open(db) as peer:
            plant(peer, kernel_file(tmp_path, 0), meta(coordesc=True), STORED_CONFIG,
                  configs())
        done = pool.submit(fa.compile_in_worker, kernel_file(tmp_path, 1),
                           meta(coordesc=True), configs(),
                           functools.partial(fa.xblock_at_least, 1024)).result(timeout=120)
        assert done["state"] == "miss"
        assert [kw["XBLOCK"] for kw, _ in done["compiled"]] == [128, 512, 64]
    finally:
        pool.shutdown()
        tunecache.disable()


def test_an_adopted_config_that_fails_to_launch_is_tuned_here(coordesc, caplog):
    # A peer's coordinate-descent result, adopted at this kernel's first run, that this
    # GPU cannot launch: coordinate descent runs here from the kernel's own config.
    import triton_fakes

    k, launcher, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key, wait=0.0)
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(32, XBLOCK=2048))
    triton_fakes.LAUNCH_FAILS.add(2048)
    try:
        with caplog.at_level(logging.WARNING, logger="tunecache"):
            adopted = first_run(k, launcher)
            assert adopted.config.kwargs == {"XBLOCK": 2048}
            # run() launches what coordinate descent returned.
            assert adopted("arg", stream=0) == ("ran", TUNED.kwargs, TUNED.num_warps)
            assert adopted("arg", stream=0) == ("ran", TUNED.kwargs, TUNED.num_warps)
    finally:
        triton_fakes.LAUNCH_FAILS.discard(2048)
    assert coordesc.tuned == [launcher]
    assert k.launchers[0].config.kwargs == TUNED.kwargs
    (warning,) = warning_lines(caplog)
    assert "launch" in warning, warning


def test_an_adopted_config_that_is_not_the_kernels_is_not_compiled(coordesc, caplog):
    k, launcher, key = coordesc.kernel(0)
    claim = coordesc.peer.claim(key, wait=0.0)
    publish_as_peer(coordesc.peer, claim, k, FakeConfig(4, XBLOCK=64, EVIL=1))
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        assert first_run(k, launcher).config.kwargs == TUNED.kwargs
    assert k.compiled == [] and coordesc.tuned == [launcher]
    (warning,) = warning_lines(caplog)
    assert "not this kernel's" in warning, warning
