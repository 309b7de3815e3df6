"""The shared-cache keys of Triton kernels and fusion benchmarks, and the validation of
their stored entries (a shared database can hold anything)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Mapping

from ..fingerprint import dist_version

__all__ = ["FUSION_KIND", "NO_SAVE_HEURISTICS", "triton_kernel_info", "triton_key",
           "fusion_benchmark_key", "fusion_ms_from_entry", "triton_config_from_entry",
           "coordesc_result"]


FUSION_KIND = "fusion_benchmark"

# Heuristics whose kernels have one fixed config and no coordinate descent
# (triton_heuristics.template / fixed_config, 2.11-2.14): a save of theirs, if any, is
# the only one; there is no coordinate-descent save to hold it back for.
NO_SAVE_HEURISTICS = ("template", "fixed_config")
_DECORATOR = re.compile(r"@triton_heuristics\.(\w+)\(")
_KERNEL_DEF = re.compile(r"@triton\.jit\s*\ndef (\w+)\(")
# DeviceProperties is a NamedTuple; its repr in the generated source starts
# "DeviceProperties(type='cuda', index=0, " (torch/_inductor/runtime/hints.py, 2.11-2.14).
_DEVICE_INDEX = re.compile(r"(DeviceProperties\(type='([^']*)', )index=\d+")
# The benchmark harness Inductor appends to a kernel module it benchmarks (fusion
# decisions, config.benchmark_kernel; codegen_kernel_benchmark in codegen/triton.py,
# 2.11-2.14) names the device index too: rand_strided(..., device='cuda:1'),
# _DeviceGuard(1), set_device(1), stream1 = get_raw_stream(1). Seen on 2xH200: without
# this the two ranks' fusion benchmark kernels had different keys, so neither reused the
# other's tuning (43 keys, 32 of them in pairs).
_HARNESS_DEVICE_INDEX = (
    (re.compile(r"(device='\w+):\d+'"), r"\1:N'"),
    (re.compile(r"\b(_DeviceGuard|set_device|get_raw_stream)\(\d+\)"), r"\1(N)"),
    (re.compile(r"\bstream\d+\b"), "streamN"),
)


def triton_kernel_info(source: str, inductor_meta: Mapping[str, Any]) -> dict[str, Any]:
    """The rank-independent identity of a generated Triton kernel module.

    ``kernel``: sha256 of the source with the device index and the kernel's name blanked
    (everything else in the source, including its inductor_meta and triton_meta, stays
    in); ``name``: the kernel's name (:func:`triton_key` keeps it without its counter);
    ``device_type``; ``device``: the GPU's capability and SM count, from the source's
    DeviceProperties; ``heuristic``: the ``triton_heuristics`` decorator; ``coordesc``:
    whether coordinate descent is on; ``tag``: ``torch.compiler.config.cache_key_tag``,
    which Inductor's own key has too.
    """
    from torch.compiler import config as compiler_config

    match = _DEVICE_INDEX.search(source)
    device_type = match.group(2) if match else "cuda"
    props = {k: m.group(1) for k in ("cc", "multi_processor_count")
             if (m := re.search(rf"DeviceProperties\([^)]*\b{k}=([^,)]+)", source))}
    normalized = _DEVICE_INDEX.sub(r"\1index=None", source)
    for pattern, blank in _HARNESS_DEVICE_INDEX:
        normalized = pattern.sub(blank, normalized)
    jit = _KERNEL_DEF.search(source)
    name = jit.group(1) if jit else str(inductor_meta.get("kernel_name") or "triton_kernel")
    if jit:
        # The name ends in a per-graph counter (triton_poi_fused_add_3): one more or one
        # less kernel earlier in the graph renumbers identical kernels.
        normalized = re.sub(rf"\b{re.escape(name)}\b", "KERNEL_NAME", normalized)
    heuristic = _DECORATOR.search(source)
    return {
        "kernel": hashlib.sha256(normalized.encode()).hexdigest(),
        "name": name,
        "device_type": "cuda" if device_type == "hip" else device_type,
        "device": (f"{device_type} cc={props.get('cc', '?')} "
                   f"sms={props.get('multi_processor_count', '?')}"),
        "heuristic": heuristic.group(1) if heuristic else "unknown",
        "coordesc": bool(inductor_meta.get("coordinate_descent_tuning")),
        "tag": str(getattr(compiler_config, "cache_key_tag", "")),
    }


def triton_key(inductor_key: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """The shared-cache key of one Triton kernel's best config.

    ``inductor_key`` is Inductor's remote-cache id for the kernel's config list: a hash of
    torch's source (``torch_key``), Triton's version and backend (``backend_hash``: the
    compiler and the GPU target, no device index) and the candidate configs.

    Compile workers compute this key too (the notes in triton/install.py), so its environment is
    only what they see exactly as the compiling process does, without touching the GPU:
    versions, and the device as the kernel's source describes it. Inductor settings that
    change a kernel's configs are in its source (inductor_meta) and its configs_hash; the
    settings made in code in the compiling process never reach the workers.
    """
    import torch

    info = dict(info)
    # The kernel's name without its per-graph counter: a label for `tunecache stats`,
    # and part of the hash like every key field, so it must not carry the counter.
    name = re.sub(r"_\d+$", "", str(info.pop("name", None) or "")) or "triton_kernel"
    env = {
        "device": str(info.pop("device", None) or info.get("device_type") or "cuda"),
        "torch": str(torch.__version__),
        "triton": dist_version("triton", "pytorch-triton", "pytorch-triton-rocm"),
        "cuda": str(torch.version.cuda or "none"),
        "hip": str(getattr(torch.version, "hip", None) or "none"),
    }
    return {
        "kind": "triton_config",
        "op": name,
        "env": env,
        "inductor_key": inductor_key,
        **info,
    }


def fusion_benchmark_key(source: str, n_spills_threshold: Any) -> dict[str, Any]:
    """The shared-cache key of one fusion benchmark: the benchmarked module's source (a
    kernel and its benchmark harness, device index blanked) on this device and versions."""
    key = triton_key("", triton_kernel_info(source, {}))
    del key["inductor_key"], key["coordesc"]
    key["kind"] = FUSION_KIND
    key["n_spills_threshold"] = str(n_spills_threshold)
    return key


def fusion_ms_from_entry(timings: Mapping[str, float]) -> float | None:
    """The timing of a stored fusion benchmark, or None if it is not one we would write."""
    if set(timings) != {"ms"}:
        return None
    return float(timings["ms"])  # validate_timings: finite and >= 0, or inf


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def triton_config_from_entry(timings: Mapping[str, float]) -> dict[str, Any] | None:
    """The best-config dict of a stored entry, or None if it is not one we would write.

    An entry holds exactly one candidate whose name is the canonical JSON of the dict
    ``AutotuneCache.save`` built (without ``time_taken_ms``). A shared database can hold
    anything, so every field Inductor turns into a Triton launch is checked.
    """
    if len(timings) != 1:
        return None
    (name,) = timings
    try:
        value = json.loads(name)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    for field, wanted in (("num_warps", int), ("num_stages", int), ("configs_hash", str)):
        v = value.get(field)
        if isinstance(v, bool) or not isinstance(v, wanted):
            return None
    if not (_is_pow2(value["num_warps"]) and value["num_warps"] <= 64):
        return None
    if not 0 <= value["num_stages"] <= 16:
        return None
    for k, v in value.items():
        if k == "extra_options":
            if v is not None and not isinstance(v, dict):
                return None
        elif k == "found_by_coordesc":
            if not isinstance(v, bool):
                return None
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if k.upper().endswith("BLOCK") and not (_is_pow2(v) and v <= 1 << 20):
                return None
            if abs(v) > 1 << 31:
                return None
        elif isinstance(v, float):
            if not math.isfinite(v):
                return None
        elif isinstance(v, str):
            if len(v) > 256:
                return None
        else:
            return None
    value["time_taken_ms"] = int(timings[name]) if math.isfinite(timings[name]) else 0
    return value


def coordesc_result(timings: Mapping[str, float]) -> dict[str, Any] | None:
    """:func:`triton_config_from_entry`, where that config is a coordinate-descent result."""
    best = triton_config_from_entry(timings)
    return best if best is not None and best.get("found_by_coordesc") else None
