"""Stand-ins for what a Triton kernel load hands Inductor's autotune-cache code.

A module of its own (not in tests/triton_autotune/) because Inductor's compile workers
unpickle these by name: the worker test submits :func:`load_kernel` to a real
SubprocPool, whose processes find this directory on the PYTHONPATH they inherit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BACKEND_HASH = "b" * 64


class FakeConfig:
    """What Inductor reads of a triton.Config (kwargs, num_warps, num_stages)."""

    def __init__(self, num_warps: int, num_stages: int = 1, **kwargs: int) -> None:
        self.kwargs = kwargs
        self.num_warps = num_warps
        self.num_stages = num_stages

    def __repr__(self) -> str:
        return f"FakeConfig({self.kwargs}, w={self.num_warps}, s={self.num_stages})"


def configs() -> list[FakeConfig]:
    return [FakeConfig(4, XBLOCK=128), FakeConfig(8, XBLOCK=512), FakeConfig(2, XBLOCK=64)]


def meta(coordesc: bool = False, name: str = "triton_poi_fused_add_0") -> dict[str, Any]:
    return {
        "autotune_local_cache": False,  # the remote (shared) cache is what we test
        "autotune_remote_cache": True,
        "backend_hash": BACKEND_HASH,
        "coordinate_descent_tuning": coordesc,
        "kernel_name": name,
    }


def benchmark_harness(index: int, size: int = 1024) -> str:
    """What Inductor appends to a kernel module it benchmarks (codegen_kernel_benchmark)."""
    return (
        "def get_args():\n"
        f"    arg_0 = rand_strided(({size},), (1,), device='cuda:{index}', "
        "dtype=torch.float32)\n"
        "    return arg_0,\n"
        "def call(args):\n"
        f"    with torch.cuda._DeviceGuard({index}):\n"
        f"        torch.cuda.set_device({index})\n"
        f"        stream{index} = get_raw_stream({index})\n"
        f"        triton_poi_fused_add_0.run(*args, stream=stream{index})\n"
    )


def kernel_source(index: int, body: str = "tmp0 + tmp1", heuristic: str = "pointwise",
                  tail: str = "") -> str:
    """A kernel module as Inductor writes it; the device index differs per rank."""
    return (
        "import triton\n"
        "from torch._inductor.runtime import triton_heuristics\n"
        "from torch._inductor.runtime.hints import DeviceProperties\n"
        f"@triton_heuristics.{heuristic}(size_hints={{'x': 1024}}, "
        "triton_meta={'signature': {'in_ptr0': '*fp32'}, "
        f"'device': DeviceProperties(type='cuda', index={index}, multi_processor_count=132, "
        "cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, "
        "max_threads_per_block=1024, warp_size=32)}, inductor_meta={})\n"
        "@triton.jit\n"
        f"def triton_poi_fused_add_0(in_ptr0, xnumel, XBLOCK: tl.constexpr):\n    {body}\n"
        + tail
    )


def kernel_file(tmp: Path, index: int, body: str = "tmp0 + tmp1",
                heuristic: str = "pointwise", tail: str = "") -> str:
    """:func:`kernel_source`, written under ``tmp``; returns its path."""
    source = kernel_source(index, body, heuristic, tail)
    path = tmp / f"rank{index}-{abs(hash((body, heuristic, tail))) % 10**8}" / "kernel.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return str(path)


def load_kernel(filename: str, kernel_meta: dict[str, Any]) -> dict[str, Any]:
    """What a compile worker does for a kernel's cache (Inductor's check_autotune_cache),
    returned to the parent the way the pickled kernel carries it."""
    from torch._inductor import remote_cache as rc
    from torch._inductor.runtime import triton_heuristics as th

    cfgs, autotune_cache, info = th.check_autotune_cache(configs(), filename, kernel_meta)
    return {
        "configs": cfgs,
        "autotune_cache": autotune_cache,
        "state": info.get("autotune_cache_state"),
        "remote_class": rc.RemoteAutotuneCache.__name__,
    }


class TritonConfig(FakeConfig):
    """What Inductor rebuilds a stored coordinate-descent config as (triton.Config's
    signature); tests put it in place of autotune_cache.Config, as there is no triton."""

    def __init__(self, kwargs: dict[str, int], num_warps: int = 4, num_stages: int = 1) -> None:
        super().__init__(num_warps, num_stages, **kwargs)


# XBLOCK values whose launch the faked Triton refuses (CUDA's "invalid argument").
LAUNCH_FAILS: set[int] = set()


class FakeLauncher:
    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.cache_hash = f"cubin-{config.kwargs}-{config.num_warps}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.config.kwargs.get("XBLOCK") in LAUNCH_FAILS:
            raise RuntimeError(f"invalid argument launching {self.config.kwargs}")
        return ("ran", dict(self.config.kwargs), self.config.num_warps)


class FakeKernel:
    """What coordinate descent reads of a CachingAutotuner (with 2.13's fast-path fields)
    whose autotune cache is ``autotune_cache``; records the configs it compiles."""

    def __init__(self, autotune_cache: Any, inductor_meta: dict[str, Any]) -> None:
        import threading
        from types import SimpleNamespace

        self.save_cache_hook = autotune_cache.save
        self.triton_meta = {"device": 0, "device_type": "cuda"}  # as CachingAutotuner keeps it
        self.configs = configs()
        self.inductor_meta = inductor_meta
        self.heuristic_type = SimpleNamespace(name="POINTWISE")
        self.lock = threading.Lock()
        self.fn = SimpleNamespace(fn=object())
        self._cached_launcher = None
        self._cache_eligible = True
        self.compiled: list[FakeConfig] = []

    def _precompile_config(self, cfg: FakeConfig) -> Any:
        from types import SimpleNamespace

        self.compiled.append(cfg)
        return SimpleNamespace(make_launcher=lambda: FakeLauncher(cfg))

    def benchmark_all_configs(self, *args: Any, **kwargs: Any) -> Any:
        """CachingAutotuner's, as the class has it now (tests fake it)."""
        from torch._inductor.runtime import triton_heuristics as th

        return th.CachingAutotuner.benchmark_all_configs(self, *args, **kwargs)
