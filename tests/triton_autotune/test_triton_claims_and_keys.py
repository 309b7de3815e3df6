"""tunecache.inductor's Triton section.

The core claim API the Triton section relies on, enable/disable, and the kernel key.

Triton is not installed on the CPU test machines: autotune_helpers.py says how these tests
drive Inductor's own autotune-cache code with fake configs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from autotune_helpers import (  # noqa: E402
    create,
    publish_while_waiting,
)
from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor import remote_cache as rc  # noqa: E402
from torch._inductor.runtime import autotune_cache as ac  # noqa: E402
from torch._inductor.runtime import triton_heuristics as th  # noqa: E402
from triton_fakes import (  # noqa: E402
    benchmark_harness,
    kernel_file,
    meta,
)

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402
from tunecache.store.claims import Claim  # noqa: E402


def test_core_claim_publish_take_over_and_wait(db_url):

    db = db_url
    key = {"kind": "triton_config", "op": "k", "kernel": "x"}
    with tunecache.open(db) as a, tunecache.open(db) as b:
        live = {**key, "kernel": "live"}
        assert isinstance(a.claim(live, lease_seconds=600), Claim)
        assert b.claim(live, wait=0.0) is None  # a live claim, and we would not wait
        first = a.claim(key, lease_seconds=0.5)
        assert first is not None and not isinstance(first, tunecache.Result)
        # Waits for the lease to pass (the wait only bounds a hang), then takes over.
        second = b.claim(key, wait=60.0)
        assert second is not None and not isinstance(second, tunecache.Result)
        assert a.publish(first, {"late": 1.0}) is None  # fenced off
        assert b.publish(second, {"won": 2.0}).source == "tuned"
        hit = a.claim(key)
        assert hit.source == "hit" and hit.timings == {"won": 2.0}

        other = {**key, "kernel": "y"}
        claim = a.claim(other, lease_seconds=30)
        peer = publish_while_waiting(b, lambda: a.publish(claim, {"c": 3.0}))
        waited = b.claim(other, wait=60.0)
        peer.join(60)
        assert waited.source == "peer" and waited.timings == {"c": 3.0}
    with tunecache.open(db, mode="readonly") as ro:
        assert ro.claim({**key, "kernel": "z"}) is None
        assert ro.claim(key).source == "hit"


def test_a_claim_given_back_unneeded_is_not_a_failed_attempt(db_url):
    # A measurement stopped because the search will not ask for it: were it an attempt,
    # the key would end failed after max_attempts, and every rank then measures it alone.
    key = {"kind": "fusion_benchmark", "op": "k", "kernel": "x"}
    with tunecache.open(db_url) as a, tunecache.open(db_url) as b:
        for _ in range(a.settings.max_attempts + 1):
            claim = b.claim(key, wait=0.0)
            assert isinstance(claim, Claim)
            b.release(claim, "_NoLongerWanted: ", failed=False)
        a.release(a.claim(key, wait=0.0), "RuntimeError: boom")  # a real failure counts
        assert isinstance(b.claim(key, wait=0.0), Claim)
        assert b.lookup(key) is None


def test_enable_plugs_in_and_disable_restores(tmp_path):
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codegen.triton import TritonScheduling
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner
    from torch._inductor.scheduler import Scheduler

    before = (rc.RemoteAutotuneCache, inductor_config.autotune_remote_cache,
              inductor_config.compile_threads, ac.AutotuneCache.__dict__["create"])
    # Inductor's own methods that the runtime hooks wrap (this torch's real ones).
    hooked = [(th.CachingAutotuner, "coordinate_descent_tuning"),
              (th.CachingAutotuner, "autotune_to_one_config"),
              (th.CachingAutotuner, "_dynamic_scale_rblock"),
              (th.CachingAutotuner, "precompile"), (ac.AutotuneCache, "read_best"),
              (CoordescTuner, "autotune_single_field"),
              (CoordescTuner, "call_func"),
              (TritonScheduling, "benchmark_codegened_module"),
              (Scheduler, "compile_kernel"), (AsyncCompile, "triton")]
    own = [owner.__dict__[name] for owner, name in hooked]
    cache = tunecache.open(str(tmp_path / "tune.db"))
    assert tunecache.enable(cache)
    try:
        assert all(owner.__dict__[name] is not orig
                   for (owner, name), orig in zip(hooked, own))
        assert rc.RemoteAutotuneCache is not before[0]
        assert rc.RemoteAutotuneCache.__name__ == "TuneCacheAutotuneCache"
        assert inductor_config.autotune_remote_cache is True
        assert inductor_config.compile_threads == 1
        # Inductor's create_cache finds our class by name, as it finds the Redis one.
        assert type(rc.create_cache("x", False, "FbRemoteAutotuneCache",
                                    "RemoteAutotuneCache")) is rc.RemoteAutotuneCache
    finally:
        tunecache.disable()
        cache.close()
    after = (rc.RemoteAutotuneCache, inductor_config.autotune_remote_cache,
             inductor_config.compile_threads, ac.AutotuneCache.__dict__["create"])
    assert after == before
    assert [owner.__dict__[name] for owner, name in hooked] == own


def test_count_only_leaves_triton_alone():
    before = rc.RemoteAutotuneCache
    assert tunecache.enable(count_only=True)
    try:
        assert rc.RemoteAutotuneCache is before
    finally:
        tunecache.disable()


def test_key_ignores_the_device_index_only(enabled, tmp_path):
    k0 = create(kernel_file(tmp_path, 0), meta()).remote_cache[1]
    k1 = create(kernel_file(tmp_path, 1), meta()).remote_cache[1]
    other = create(kernel_file(tmp_path, 0, body="tmp0 * tmp1"), meta()).remote_cache[1]
    # Inductor numbers kernels per graph: the same kernel renumbered is the same key.
    renumbered = Path(kernel_file(tmp_path, 2))
    renumbered.write_text(renumbered.read_text().replace("fused_add_0", "fused_add_7"))
    k7 = create(str(renumbered), meta()).remote_cache[1]
    assert k0 == k1
    assert json.loads(k7)["name"] == "triton_poi_fused_add_7"
    key7, key0 = (tc_inductor.triton_key("i", json.loads(k)) for k in (k7, k0))
    assert key7 == key0
    assert other != k0
    info = json.loads(k0)
    assert info["heuristic"] == "pointwise" and info["device_type"] == "cuda"
    key = tc_inductor.triton_key("inductor-key", info)
    assert key["kind"] == "triton_config" and key["op"] == "triton_poi_fused_add"
    assert "torch" in key["env"] and "triton" in key["env"]
    # The device as the source describes it: compile workers must not initialise CUDA.
    assert key["env"]["device"] == "cuda cc=90 sms=132"
    assert "index" not in json.dumps(key)


def test_benchmark_harness_device_index_is_not_in_the_key(enabled, tmp_path):
    # Kernel modules Inductor benchmarks for fusion decisions name their GPU in the
    # harness too: ranks must still share them.
    k0, k1 = (create(kernel_file(tmp_path, i, tail=benchmark_harness(i)), meta())
              .remote_cache[1] for i in (0, 1))
    bigger = create(kernel_file(tmp_path, 0, tail=benchmark_harness(0, size=2048)),
                    meta()).remote_cache[1]
    assert k0 == k1
    assert bigger != k0  # the shapes in the harness stay in


KERNELS = Path(__file__).resolve().parent.parent / "data" / "triton_kernels"


def _key_of_source(tmp_path: Path, label: str, source: str) -> dict:
    """The shared-cache key of a kernel module, as a compile worker makes it."""
    path = tmp_path / label / "kernel.py"
    path.parent.mkdir()
    path.write_text(source)
    kernel_name = re.search(r"def (\w+)\(", source).group(1)
    text = create(str(path), meta(coordesc=True, name=kernel_name)).remote_cache[1]
    return tc_inductor.triton_key("inductor-key", json.loads(text))


def test_a_kernel_written_in_place_has_the_key_of_its_out_of_place_twin(enabled, tmp_path):
    # Inductor's sources on an H200, tools/bench_gpu.py's block: the middle layer of a
    # 3-layer graph writes a reduction's result in place (in_out_ptr0) where both layers
    # of a 2-layer graph read in_ptr3 and write out_ptr1. One computation, the same bytes
    # moved; keyed apart, every deeper graph tuned it again.
    in_place = (KERNELS / "mix_order_reduction_in_place.txt").read_text()
    out_of_place = (KERNELS / "mix_order_reduction_out_of_place.txt").read_text()
    key = _key_of_source(tmp_path, "in-place", in_place)
    assert _key_of_source(tmp_path, "out-of-place", out_of_place) == key
    assert key["op"] == "triton_per_fused_add_div_expand_mul_pow_sum", \
        "the source hash that names a shared kernel is not in its key"
    # What it computes still counts: another index or another dtype is another kernel.
    for n, (old, new) in enumerate([("(r0_1 + 2048*x0), tmp22", "(r0_1 + 2049*x0), tmp22"),
                                    ("'in_ptr3': '*bf16'", "'in_ptr3': '*fp16'")]):
        assert old in in_place
        assert _key_of_source(tmp_path, f"changed-{n}", in_place.replace(old, new)) != key


def test_a_benchmarked_module_is_keyed_by_the_arguments_it_builds_not_their_count():
    # The module Inductor times to pick a mix-order reduction's split size, written in
    # place (an H200, the block's 3-layer graph). Its out-of-place twin builds one more
    # argument of a shape it already builds (the buffer it writes) and counts the bytes
    # moved otherwise; the timing is the same, so is the key.
    module = (KERNELS / "mix_order_reduction_in_place_benchmark.txt").read_text()
    key = tc_inductor.fusion_benchmark_key(module, "default")
    one_more = ("    arg_0 = rand_strided((4096, 2048), (2048, 1), device='cuda:0', "
                "dtype=torch.bfloat16)\n")
    assert one_more in module
    twin = (module.replace(one_more, one_more + one_more.replace("arg_0", "arg_6"))
            .replace("return arg_0, arg_1,", "return arg_0, arg_6, arg_1,")
            .replace("num_gb = 0.067121152", "num_gb = 0.083898368"))
    assert tc_inductor.fusion_benchmark_key(twin, "default") == key
    other_shape = module.replace("rand_strided((4096, 1), (1, 1)", "rand_strided((4096, 2), (2, 1)")
    assert other_shape != module
    assert tc_inductor.fusion_benchmark_key(other_shape, "default") != key
