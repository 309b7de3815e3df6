"""A real ``CachingAutotuner`` whose Triton compile and launch are faked, so that its own
precompile, run, autotune_to_one_config and the hooks around them run on the CPU.

A module of its own because it imports triton_heuristics at the top (triton_fakes must
not: a test there imports it while triton_heuristics is still importing), and because a
compile worker unpickles :func:`load_autotuner` by name.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from torch._inductor.runtime import triton_heuristics as th

# What the faked Triton refuses: tests set these (a config -> whether it fails).
FAILS_TO_COMPILE: list[Callable[[Any], bool]] = []
FAILS_TO_LAUNCH: list[Callable[[Any], bool]] = []


class FakeCompilationError(Exception):
    """What triton.compile raises for a config it cannot build (CompilationError)."""


def _fails(checks: list[Callable[[Any], bool]], cfg: Any) -> bool:
    return any(check(cfg) for check in checks)


class FakeRunLauncher:
    """A launcher as run() uses it: its config, cache hash, and a call that launches."""

    store_cubin = False
    n_regs = n_spills = shared = 0  # what autotune_to_one_config logs

    def __init__(self, kernel: FakeAutotuner, cfg: Any) -> None:
        self.kernel = kernel
        self.config = cfg
        self.cache_hash = f"cubin-{sorted(cfg.kwargs.items())}-{cfg.num_warps}"

    def __call__(self, *args: Any, stream: Any = None, **kwargs: Any) -> Any:
        if _fails(FAILS_TO_LAUNCH, self.config):
            raise RuntimeError(f"CUDA driver error: invalid argument ({self.config.kwargs})")
        self.kernel.launched.append(self.config)
        return ("ran", dict(self.config.kwargs), self.config.num_warps, args)


class FakeAutotuner(th.CachingAutotuner):
    """CachingAutotuner with Triton's compile and launch faked; its configs' benchmark
    prefers the last config (as the faked ones in tests/triton_autotune/ do)."""

    def _precompile_config(self, cfg: Any) -> Any:
        self.__dict__.setdefault("compiled", []).append(cfg)
        if _fails(FAILS_TO_COMPILE, cfg):
            raise FakeCompilationError(f"cannot compile {cfg}")
        return SimpleNamespace(config=cfg, kernel=None,
                               make_launcher=lambda: FakeRunLauncher(self, cfg))

    def benchmark_all_configs(self, *args: Any, **kwargs: Any) -> Any:
        return {launcher: -i for i, launcher in enumerate(self.launchers)}

    @property
    def launched(self) -> list[Any]:
        return self.__dict__.setdefault("_launched", [])


def _kernel_fn(name: str = "triton_poi_fused_add_0") -> Any:
    def kernel(in_ptr0: Any, xnumel: Any, XBLOCK: Any) -> None:
        pass

    return SimpleNamespace(fn=kernel, __name__=name)


def load_autotuner(filename: str, inductor_meta: dict[str, Any], configs: list[Any]) -> Any:
    """What a kernel load does (the ``triton_heuristics.pointwise`` decorator of a
    generated kernel module): ``cached_autotune`` -> check_autotune_cache -> the
    autotuner, on the CPU."""
    import torch
    from torch._inductor.runtime.hints import DeviceProperties, HeuristicType

    triton_meta = {"device": DeviceProperties.create(torch.device("cpu")), "signature": {}}
    return th.cached_autotune({"x": 1024}, configs, triton_meta, HeuristicType.POINTWISE,
                              filename=filename, inductor_meta=dict(inductor_meta),
                              caching_autotuner_cls=FakeAutotuner)(_kernel_fn())


def xblock_at_least(limit: int, cfg: Any) -> bool:
    return cfg.kwargs.get("XBLOCK", 0) >= limit


def compile_in_worker(filename: str, inductor_meta: dict[str, Any], configs: list[Any],
                      fails_to_compile: Callable[[Any], bool]) -> dict[str, Any]:
    """What a compile worker does (``_worker_compile_triton``): load the kernel, compile
    it (warm_cache_only) and send it back; here its configs and cache state."""
    from torch._inductor.runtime import autotune_cache as ac
    from triton_fakes import TritonConfig

    ac.Config = TritonConfig  # triton.Config; no triton on the CPU
    FAILS_TO_COMPILE[:] = [fails_to_compile]
    kernel = load_autotuner(filename, inductor_meta, configs)
    kernel.precompile(warm_cache_only=True)
    return {"compiled": [(r.config.kwargs, r.config.num_warps) for r in kernel.compile_results],
            "state": (kernel.autotune_cache_info or {}).get("autotune_cache_state")}
