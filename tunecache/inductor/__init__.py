"""PyTorch Inductor integration: GEMM autotuning timings (and, with Triton configs shared,
Triton kernels' best configs and fusion-benchmark timings) from the shared tunecache.

This package is the only part of tunecache that touches ``torch._inductor``. Its parts
(each a :class:`tunecache.parts.Part` of the one switch, tunecache.switch): ``gemm_hooks``
(the selector hooks and the deferred pass), ``narrow`` (a stored GEMM generates only the
template choices that can win), ``triton/`` (keys, the remote-cache adapter, coordinate
descent, fusion and split-size benchmarks, epilogue-fusion decisions, compile workers,
install), ``graphs`` (compiled graphs: Inductor's remote FX graph and AOTAutograd caches
over the signed graph service, with a key configured), ``kernel_sharing`` (kernels named
by their source, published once kept) and ``pgo`` (Dynamo's shape profiles: its remote
PGO cache over the same signed service; the one module here that touches
``torch._dynamo``). Beside them: ``state`` (the hook registry the process owner holds),
``stats`` (the counters), ``compat`` (what a hook needs of Inductor, the line saying a part
is off), ``fingerprint`` (the environment part of a key), ``gemm`` (hook state, candidate
ids, GEMM keys), ``entries`` (what the process knows of GEMM entries), ``transfer`` (a new
GEMM key starts from its neighbours' winners), ``deferred`` (the pre-fusion pass) and
``warmup`` (the compile of ``tunecache warm``). docs/design.md draws them.

Importing the package imports none of them: its names below load on first use, so that a
part's module can be imported without the rest (and without Triton).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "MIN_TORCH",
    "TESTED_TORCH",
    "candidate_id",
    "candidate_ids",
    "environment",
    "make_key",
    "triton_key",
    "triton_kernel_info",
    "triton_config_from_entry",
    "fusion_benchmark_key",
    "TRITON_LEASE_SECONDS",
    "recorded_settings",
    "local_caches_off",
    "compile_and_run",
]

_WHERE = {
    "MIN_TORCH": "compat",
    "TESTED_TORCH": "compat",
    "environment": "fingerprint",
    "recorded_settings": "fingerprint",
    "candidate_id": "gemm",
    "candidate_ids": "gemm",
    "make_key": "gemm",
    "triton_key": "triton",
    "triton_kernel_info": "triton",
    "triton_config_from_entry": "triton",
    "fusion_benchmark_key": "triton",
    "TRITON_LEASE_SECONDS": "triton",
    "local_caches_off": "warmup",
    "compile_and_run": "warmup",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'tunecache.inductor' has no attribute {name!r}")
