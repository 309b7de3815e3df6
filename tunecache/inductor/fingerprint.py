"""The environment fingerprint of a GEMM key: device, versions and the Inductor settings
that change the candidates or their timings; and, for ``tunecache warm``, compiling
under the settings a recorded fingerprint names."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import platform
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["CONFIG_FLAGS", "LIBRARY_FIELDS", "dist_version", "environment", "recorded_settings"]

log = logging.getLogger("tunecache")


# Inductor config flags that change the candidate set or the numerics of a GEMM; read per
# lookup because users patch them per compile (torch/_inductor/config.py, 2.11-2.14).
# A dotted name reads a nested config class; a missing flag reads as "-".
CONFIG_FLAGS = (
    "max_autotune_gemm_backends",
    "max_autotune_gemm_search_space",
    "max_autotune_conv_backends",
    "emulate_precision_casts",
    "cpu_backend",
    "cuda_backend",
    "cpp.simdlen",
    "triton.enable_persistent_tma_matmul",
    "triton.use_tensor_descriptor",
    "cuda.cutlass_max_profiling_configs",
    "cuda.cutlass_op_allowlist_regex",
    "cuda.cutlass_op_denylist_regex",
)


# The fields of the fingerprint that are library versions: an upgrade changes them and
# nothing else, so a key that differs from a recorded one only in these is the same key
# under another version (tunecache.inductor.upgrade).
LIBRARY_FIELDS = ("torch", "triton", "cuda", "hip")


def dist_version(*names: str) -> str:
    # importlib.metadata, not `import triton`: cheap, and the key must not depend on
    # whether someone imported triton yet.
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


@functools.cache
def _device_env(device_type: str) -> tuple[tuple[str, str], ...]:
    """Hardware part of the fingerprint for one device type (cached: it cannot change)."""
    import torch

    env: dict[str, str] = {}
    if device_type == "cuda" and torch.cuda.is_available():
        # Name and capability only, never the index: ranks on GPUs 0..7 share keys.
        idx = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(idx)
        env["device"] = torch.cuda.get_device_name(idx)
        env["capability"] = f"{major}.{minor}"
    elif device_type == "cpu":
        env["device"] = _cpu_model()
        try:
            from torch._inductor import cpu_vec_isa

            env["isa"] = str(cpu_vec_isa.pick_vec_isa()) or "none"
        except Exception:  # noqa: BLE001 - the ISA only refines the key; never fail on it
            env["isa"] = "unknown"
    else:
        try:
            env["device"] = torch.get_device_module(device_type).get_device_name()
        except Exception:  # noqa: BLE001 - unknown backends still get a usable key
            env["device"] = device_type
    env["device_type"] = device_type
    return tuple(sorted(env.items()))


def _config_value(name: str) -> str:
    from torch._inductor import config

    obj: Any = config
    for part in name.split("."):
        obj = getattr(obj, part, "-")
    return str(obj)


def environment(device_type: str) -> dict[str, str]:
    """The environment fingerprint of a key: everything outside the op that changes the
    candidates or their timings. All values are strings (the key convention)."""
    import torch

    env = dict(_device_env(device_type))
    env["torch"] = str(torch.__version__)
    env["triton"] = dist_version("triton", "pytorch-triton", "pytorch-triton-rocm")
    env["cuda"] = str(torch.version.cuda or "none")
    env["hip"] = str(getattr(torch.version, "hip", None) or "none")
    if device_type == "cpu":
        # CPU GEMM timings scale with the thread count; a 4-thread winner is not a
        # 64-thread winner.
        env["threads"] = str(torch.get_num_threads())
    if device_type == "cuda":
        matmul = torch.backends.cuda.matmul
        env["fp16_reduced_reduction"] = str(matmul.allow_fp16_reduced_precision_reduction)
        env["bf16_reduced_reduction"] = str(matmul.allow_bf16_reduced_precision_reduction)
    for flag in CONFIG_FLAGS:
        env[f"inductor.{flag}"] = _config_value(flag)
    return env


def _recorded_value(text: str, current: Any) -> Any:
    """A recorded str(config value) back in the type of the current value."""
    if text == "None":
        return None
    if isinstance(current, bool):
        return text == "True"
    if isinstance(current, int):
        return int(text)
    if isinstance(current, float):
        return float(text)
    return text


@contextlib.contextmanager
def recorded_settings(precision: str, env: Mapping[str, str]) -> Iterator[None]:
    """Compile under the settings that are part of a recorded key (``precision`` and the
    Inductor flags, CPU threads and reduced-precision reductions of its fingerprint
    ``env``), so this machine's key matches the one a job with those settings computes
    (``tunecache warm``)."""
    import torch
    from torch._inductor import config

    patches: dict[str, Any] = {}
    for name, text in env.items():
        if not name.startswith("inductor."):
            continue
        flag = name[len("inductor."):]
        obj: Any = config
        try:
            for part in flag.split("."):
                obj = getattr(obj, part)
            if str(obj) != text:
                patches[flag] = _recorded_value(text, obj)
        except (AttributeError, ValueError):
            log.debug("tunecache warm: cannot apply recorded %s=%s", name, text)
    old_precision = torch.get_float32_matmul_precision()
    old_threads = torch.get_num_threads()
    matmul = torch.backends.cuda.matmul
    old_reduced = (matmul.allow_fp16_reduced_precision_reduction,
                   matmul.allow_bf16_reduced_precision_reduction)
    try:
        torch.set_float32_matmul_precision(precision)
        if env.get("device_type") == "cpu" and env.get("threads", "").isdigit():
            torch.set_num_threads(int(env["threads"]))
        if "fp16_reduced_reduction" in env:
            matmul.allow_fp16_reduced_precision_reduction = env["fp16_reduced_reduction"] == "True"
        if "bf16_reduced_reduction" in env:
            matmul.allow_bf16_reduced_precision_reduction = env["bf16_reduced_reduction"] == "True"
        with config.patch(patches):
            yield
    finally:
        torch.set_float32_matmul_precision(old_precision)
        torch.set_num_threads(old_threads)
        (matmul.allow_fp16_reduced_precision_reduction,
         matmul.allow_bf16_reduced_precision_reduction) = old_reduced
