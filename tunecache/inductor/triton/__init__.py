"""Triton kernel autotuning through the shared cache: kernel keys, the remote autotune-cache
adapter, coordinate descent, fusion and split-size benchmarks, and their install
(triton/install.py has the notes on every hook)."""

from __future__ import annotations

from .install import FUSION, TRITON
from .kernel_keys import (
           fusion_benchmark_key,
           triton_config_from_entry,
           triton_kernel_info,
           triton_key,
)
from .remote import TRITON_LEASE_SECONDS, TritonCache

__all__ = ["TRITON_LEASE_SECONDS", "TritonCache", "TRITON", "FUSION", "fusion_benchmark_key",
           "triton_config_from_entry", "triton_key", "triton_kernel_info"]
