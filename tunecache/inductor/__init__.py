"""PyTorch Inductor integration: GEMM autotuning timings (and, with ``triton_configs`` on,
Triton kernels' best configs and fusion-benchmark timings) from the shared tunecache.

This package is the only part of tunecache that touches ``torch._inductor``. Its rooms:
``switch`` (enable/disable), ``parts`` (the one shape of an optional part), ``state``
(the one registry of installed hooks, and its ledger of every attribute set on Inductor,
a ``tunecache.patching.Ledger``), ``stats``, ``compat`` (supported versions, an Inductor
that changed, the line saying a part is off), ``fingerprint`` (the environment part of a
key), ``gemm`` (selector hooks, candidate ids, GEMM keys), ``entries`` (what the process
knows of GEMM entries), ``transfer`` (a new GEMM key starts from its neighbours'
winners), ``narrow`` (a stored GEMM generates only the template choices that can win),
``deferred`` (the pre-fusion pass), ``triton/`` (keys, the remote-cache adapter,
coordinate descent, fusion and split-size benchmarks, epilogue-fusion decisions, compile
workers, install), ``graphs`` (compiled graphs: Inductor's remote FX graph and
AOTAutograd caches over the signed graph service, with a key configured), ``pgo``
(Dynamo's shape profiles: its remote PGO cache over the same signed service, unless
TUNECACHE_PGO=0; the one module here that touches ``torch._dynamo``) and ``warmup`` (the
compile of ``tunecache warm``).
docs/design.md draws them.
"""

from __future__ import annotations

from .compat import SUPPORTED_TORCH
from .fingerprint import environment, recorded_settings
from .gemm import candidate_id, candidate_ids, make_key
from .state import REGISTRY
from .stats import Stats, TritonStats
from .switch import disable, enable, is_enabled
from .triton import (
                     TRITON_LEASE_SECONDS,
                     fusion_benchmark_key,
                     triton_config_from_entry,
                     triton_kernel_info,
                     triton_key,
)
from .warmup import compile_and_run, local_caches_off

__all__ = [
    "enable",
    "disable",
    "is_enabled",
    "stats",
    "Stats",
    "SUPPORTED_TORCH",
    "candidate_id",
    "candidate_ids",
    "environment",
    "make_key",
    "triton_stats",
    "TritonStats",
    "triton_key",
    "triton_kernel_info",
    "triton_config_from_entry",
    "fusion_benchmark_key",
    "TRITON_LEASE_SECONDS",
    "recorded_settings",
    "local_caches_off",
    "compile_and_run",
]

# The registry's counters, under the names the README and tools/bench_gpu.py use (the
# same objects: reset() clears them in place).
stats = REGISTRY.stats
triton_stats = REGISTRY.triton_stats
