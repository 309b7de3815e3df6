"""The compile of one recorded GEMM for ``tunecache warm``: Inductor's local caches off,
the recorded settings on, ``torch.compile`` in max-autotune mode."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .fingerprint import recorded_settings

__all__ = ["local_caches_off", "compile_and_run"]


@contextlib.contextmanager
def local_caches_off() -> Iterator[None]:
    """Inductor reaches its autotune lookup only on a real miss: no FX graph cache and no
    local or remote autotune cache may answer for the shared one (a graph hit skips
    lowering, and with it every lookup)."""
    from torch._inductor import config

    with config.patch({"fx_graph_cache": False, "autotune_local_cache": False,
                       "autotune_remote_cache": False}):
        yield


def compile_and_run(fn: Callable[..., Any], args: Sequence[Any], precision: str,
                    env: Mapping[str, str]) -> None:
    """Compile ``fn`` as a job with the recorded ``precision`` and fingerprint ``env``
    would, and run it once on ``args`` (which autotunes its GEMM)."""
    import torch

    with recorded_settings(precision, env), torch.no_grad():
        compiled = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
        compiled(*args)
