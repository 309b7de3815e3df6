"""The shared-cache keys of Triton kernels and fusion benchmarks, and the validation of
their stored entries (a shared database can hold anything)."""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ... import keys as tc_keys
from ... import stored_json
from ..fingerprint import dist_version
from ..transfer import AGREE, Agreement, octaves

__all__ = ["FUSION_KIND", "NO_SAVE_HEURISTICS", "triton_kernel_info", "triton_key",
           "fusion_benchmark_key", "fusion_ms_from_entry", "triton_config_from_entry",
           "triton_entry_problem", "triton_config_problem", "kernel_config_problem",
           "coordesc_result", "config_fields", "config_text", "kernel_family_text",
           "kernel_sizes", "nearest_results", "results_agreement", "size_distance",
           "TRITON_MAX_OCTAVES"]


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
# _DeviceGuard(1), set_device(1), stream1 = get_raw_stream(1). In a two-rank job, without
# this the two ranks' fusion benchmark kernels had different keys, so neither reused the
# other's tuning (43 keys, 32 of them in pairs).
_HARNESS_DEVICE_INDEX = (
    (re.compile(r"(device='\w+):\d+'"), r"\1:N'"),
    (re.compile(r"\b(_DeviceGuard|set_device|get_raw_stream)\(\d+\)"), r"\1(N)"),
    (re.compile(r"\bstream\d+\b"), "streamN"),
)


def triton_kernel_info(source: str, inductor_meta: Mapping[str, Any]) -> dict[str, Any]:
    """The rank-independent identity of a generated Triton kernel module.

    ``kernel``: sha256 of the source with the device index, the kernel's name and which
    buffers it reads and writes blanked (:func:`buffer_names_blanked`; everything else in
    the source, including its inductor_meta and triton_meta, stays in); ``name``: the
    kernel's name (:func:`triton_key` keeps it without its counter); ``device_type``;
    ``device``: the GPU's capability and SM count, from the source's DeviceProperties;
    ``heuristic``: the ``triton_heuristics`` decorator; ``coordesc``:
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
    normalized = buffer_names_blanked(normalized)
    heuristic = _DECORATOR.search(source)
    info = {
        "kernel": hashlib.sha256(normalized.encode()).hexdigest(),
        "name": name,
        "device_type": "cuda" if device_type == "hip" else device_type,
        "device": (f"{device_type} cc={props.get('cc', '?')} "
                   f"sms={props.get('multi_processor_count', '?')}"),
        "heuristic": heuristic.group(1) if heuristic else "unknown",
        "coordesc": bool(inductor_meta.get("coordinate_descent_tuning")),
        "tag": str(getattr(compiler_config, "cache_key_tag", "")),
    }
    # Beside the key, not in it (triton_key drops them): the family of this kernel at
    # every size, and its sizes, for transfer (coordesc.py).
    info[FAMILY_FIELD] = hashlib.sha256(tc_keys.canonical_json({
        "source": kernel_family_text(normalized),
        "env": _env(str(info["device"]), str(info["device_type"])),
        **{k: info[k] for k in ("heuristic", "coordesc", "tag")},
    }).encode()).hexdigest()
    info[SIZES_FIELD] = kernel_sizes(source)
    return info


# A kernel's buffer arguments: read, written, or written in place (Inductor's
# KernelArgs names, 2.11-2.14).
_BUFFER_ARG = re.compile(r"\b(?:in_out_ptr|in_ptr|out_ptr)\d+\b")
_SIGNATURE_BUFFERS = re.compile(r"(?:'BUF': '[^']*', )+")
_BUF_DTYPE = re.compile(r"'BUF': ('[^']*')")
_PARAMETER_BUFFERS = re.compile(r"(?:\bBUF, )+")
# Inductor's divisibility hints, one per argument position (triton_meta's 'configs').
_ARG_HINTS = re.compile(r"'configs': \[\{(.*?)\}\]")
_ARG_HINT = re.compile(r"\(\d+,\): (\[\[.*?\]\])")
# The benchmark harness's arguments (get_args: one line per kernel argument) and its
# estimate of the bytes moved, which counts a buffer written in place twice.
_HARNESS_ARGS = re.compile(r"(?:^[ \t]*arg_\d+ = .*\n)+", re.M)
_HARNESS_ARG = re.compile(r"^[ \t]*arg_\d+ = (.*)$", re.M)
_DERIVED_SIZES = (
    (re.compile(r"return (?:arg_\d+, ?)+"), "return ARGS, "),
    (re.compile(r"^([ \t]*num_gb = ).*$", re.M), r"\1N"),
    (re.compile(r"'kernel_num_gb': [0-9.e+-]+"), "'kernel_num_gb': N"),
    (re.compile(r"'mutated_arg_names': \[[^\]]*\]"), "'mutated_arg_names': []"),
)


def _distinct(part: re.Pattern[str], match: re.Match[str]) -> str:
    """The distinct values of ``part`` in a match, sorted: the same for any number of
    repeats and in any order."""
    return ", ".join(sorted(set(part.findall(match.group(0)))))


def buffer_names_blanked(text: str) -> str:
    """A kernel module's source with the names of the buffers it reads and writes blanked.

    Inductor writes a result in place (``in_out_ptr0``) where the input it replaces dies
    at that kernel, which depends on the graph around it: the middle layer of a 3-layer
    graph writes a reduction's result in place where both layers of a 2-layer graph write
    a new buffer (``in_ptr3`` read, ``out_ptr1`` written). The two kernels compute the
    same thing with the same index expressions and move the same bytes, so their best configs
    and benchmark timings are the same; blanked, both have one key. What stays: every
    load and store with its index, the set of buffer dtypes, the other arguments.
    """
    text = _BUFFER_ARG.sub("BUF", text)
    text = _SIGNATURE_BUFFERS.sub(lambda m: f"'BUF': {_distinct(_BUF_DTYPE, m)}, ", text)
    text = _PARAMETER_BUFFERS.sub("BUF, ", text)
    text = _ARG_HINTS.sub(lambda m: f"'configs': [{{{_distinct(_ARG_HINT, m)}}}]", text)
    text = _HARNESS_ARGS.sub(lambda m: f"    ARGS = {_distinct(_HARNESS_ARG, m)}\n", text)
    for pattern, blank in _DERIVED_SIZES:
        text = pattern.sub(blank, text)
    return text


# The fields triton_kernel_info adds for transfer that are not part of the key.
FAMILY_FIELD = "family"
SIZES_FIELD = "sizes"

# What Inductor writes that depends on the sizes of a kernel and not on what it computes
# (2.11's sources of one llama block at 1000, 1024, 2048 and 4096 tokens,
# tests/data/triton_kernels): the numel assignments of the body, the size_hints, the
# metadata derived from sizes (tiling_scores, kernel_num_gb, kernel_flop,
# add_persistent_rblock: set once the reduction is small enough), and the divisibility
# hints of the arguments (a numel divisible by 16 or not). In index arithmetic, a stride
# that spans a token dimension (``262144*(x0 // 128)``) changes with it.
_SIZE_LITERALS = (
    (re.compile(r"^(\s*(?:x|y|z|r0_|r1_|r)numel = )\d+$", re.M), r"\1N"),
    (re.compile(r"^(\s*[XYZR]\d*_?BLOCK: tl\.constexpr = )\d+$", re.M), r"\1N"),
    (re.compile(r"size_hints=\{[^}]*\}"), "size_hints={}"),
    (re.compile(r"'tiling_scores': \{[^}]*\}"), "'tiling_scores': {}"),
    (re.compile(r"'(kernel_num_gb|kernel_flop)': [0-9.e+-]+"), r"'\1': N"),
    (re.compile(r"'add_persistent_rblock': \w+, "), ""),
    (re.compile(r"'configs': \[\{.*?\}\]"), "'configs': []"),
)
# An index expression: the pointer argument of tl.load / tl.store (up to its first
# top-level comma, which Inductor's codegen never nests), or the right-hand side of an
# index variable (x0 = ..., r0_1 = ..., xindex = ...): not the tmpN values.
_LOAD_STORE_INDEX = re.compile(r"(tl\.(?:load|store)\((?:BUF|[a-z_]+\d*) \+ )([^,]*)")
_INDEX_ASSIGN = re.compile(r"^(\s*(?:[xyzr]\d*_?\d*|[xyzr]0?_?(?:index|offset|base)) = )(.*)$",
                           re.M)
_INT = re.compile(r"(?<![\w.])\d+(?![\w.])")
# Masks follow from divisibility, not from what a kernel computes: where a size is a
# multiple of every block size a config can take, Inductor writes a constant mask
# (``r0_mask = tl.full(...)``), passes None or leaves the mask out of a load or store,
# and drops the load's ``other=``; at a size that is not, ``r0_index < r0_numel`` and
# ``r0_mask & xmask``. Same configs, same costs (2.11's sources of a sum over tokens at
# 4096 and 8192 tokens on an H200).
_MASK = r"(?:None|[xyzr]\d*_?mask(?: & [xyzr]\d*_?mask)*)"
_MASK_ASSIGN = re.compile(r"^([ \t]*[xyzr]\d*_?mask = ).*$", re.M)
_LOAD_STORE_LINE = re.compile(r"^.*\btl\.(?:load|store)\(.*$", re.M)
_MASK_ARG = re.compile(rf", {_MASK}(?=[,)])")
_OTHER_ARG = re.compile(r", other=[^,)]*")
_WHERE_MASK = re.compile(rf"\btl\.where\({_MASK}, ")
# A float constant of the computation can be a size: a mean over a whole tensor divides
# by its numel (``tl.full([1, 1], 2.9802322387695312e-08, tl.float32)`` is 1/(8192*4096)).
# Which constant a kernel multiplies by does not change what a config costs.
_FLOAT_CONSTANT = re.compile(
    r"(tl\.full\(\[[^\]]*\], )-?(?:\d+\.\d*|\d+(?=e))(?:e[-+]?\d+)?(?=, tl\.float)")
# A benchmarked module's harness: its arguments' shapes and the numel it passes.
_HARNESS_SIZES = re.compile(r"^([ \t]*(?:ARGS = |return ARGS, ))(.*)$", re.M)
# With constant masks a persistent reduction also leaves out the select of its identity
# (``tmp6 = tl.where(r0_mask & xmask, tmp4, float("-inf"))``), so every later
# temporary is numbered one lower (2.11's softmax at 1000 and 1024 tokens).
_IDENTITY_SELECT = re.compile(
    r"^[ \t]*(tmp\d+) = tl\.where\(MASK, (tmp\d+), (?!_?tmp)[^\n]*\)\n", re.M)
_TEMPORARY = re.compile(r"\b(_?)tmp(\d+)\b")


def _masks_blanked(text: str) -> str:
    text = _MASK_ASSIGN.sub(r"\1MASK", text)
    text = _LOAD_STORE_LINE.sub(
        lambda m: _OTHER_ARG.sub("", _MASK_ARG.sub(", MASK", m.group(0))), text)
    text = _WHERE_MASK.sub("tl.where(MASK, ", text)
    at = 0
    while select := _IDENTITY_SELECT.search(text, at):
        rest = re.sub(rf"\b{select.group(1)}\b", select.group(2), text[select.end():])
        text, at = text[:select.start()] + rest, select.start()
    numbers: dict[str, int] = {}
    return _TEMPORARY.sub(
        lambda m: f"{m.group(1)}tmp{numbers.setdefault(m.group(2), len(numbers))}", text)


def kernel_family_text(normalized: str) -> str:
    """A kernel's source (device index and name already blanked) with what depends on
    its sizes blanked: the same kernel at another token count gives the same text. What
    is blanked: literal sizes, index strides that span a size, masks, float constants
    and a harness's shapes. A family only chooses the configs a kernel starts its tuning
    from (never a result it runs untimed, unless neighbours decide), so two kernels that
    differ in those and nothing else may share one."""
    text = normalized
    for pattern, blank in _SIZE_LITERALS:
        text = pattern.sub(blank, text)
    text = _LOAD_STORE_INDEX.sub(lambda m: m.group(1) + _INT.sub("N", m.group(2)), text)
    text = _INDEX_ASSIGN.sub(lambda m: m.group(1) + _INT.sub("N", m.group(2)), text)
    text = _HARNESS_SIZES.sub(lambda m: m.group(1) + _INT.sub("N", m.group(2)), text)
    text = _FLOAT_CONSTANT.sub(r"\1F", text)
    return _masks_blanked(text)


_SIZE_HINT = re.compile(r"'(\w+)': (\d+)")


def kernel_sizes(source: str) -> dict[str, int]:
    """The kernel's ``size_hints`` ({"x": 8388608, "r0_": 4096}): what Inductor sizes its
    configs by, powers of two; {} where the source has none."""
    hints = re.search(r"size_hints=\{([^}]*)\}", source)
    if not hints:
        return {}
    return {k: int(v) for k, v in _SIZE_HINT.findall(hints.group(1))}


# How far (octaves of each size) a recorded kernel of the same family may be for its
# config to be a starting point worth a benchmark.
TRITON_MAX_OCTAVES = 2.0


def size_distance(ours: Mapping[str, Any], theirs: Any) -> float | None:
    """The log2 distance of two kernels' sizes (the sum over dimensions), or None where
    ``theirs`` (read from a shared database: anything) is not sizes of the same
    dimensions, or one dimension is more than :data:`TRITON_MAX_OCTAVES` away."""
    if not isinstance(theirs, Mapping) or set(theirs) != set(ours) or not ours:
        return None
    mine, their = list(ours.values()), [theirs[k] for k in ours]
    if not all(_int(v) and v > 0 for v in mine + their):
        return None
    return octaves(mine, their, TRITON_MAX_OCTAVES)


def nearest_results(sizes: Mapping[str, Any], neighbours: Sequence[Any]
                    ) -> list[tuple[str, dict[str, Any], Mapping[str, Any]]]:
    """(key hash, best-config dict, meta) of each of a kernel's ``neighbours`` (entries of
    its family: ``key_hash``, ``timings``, ``meta``) within :data:`TRITON_MAX_OCTAVES` of
    ``sizes`` whose config is a coordinate-descent result, nearest first."""
    ranked = []
    for n in neighbours:
        distance = size_distance(sizes, n.meta.get(SIZES_FIELD))
        best = None if distance is None else coordesc_result(n.timings)
        if best is not None:
            ranked.append((distance, n.key_hash, best, n.meta))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [(key_hash, best, meta) for _, key_hash, best, meta in ranked]


def results_agreement(nearest: Sequence[tuple[str, dict[str, Any], Mapping[str, Any]]]
                      ) -> Agreement:
    """Whether a kernel's nearest neighbours (:func:`nearest_results`; at least one), all
    tuned by a full descent (not by transfer), all found the same config: that config."""
    if any("transfer" in meta for _, _, meta in nearest):
        return Agreement("a neighbour was itself transferred")
    if len({config_text(best) for _, best, _ in nearest}) != 1:
        return Agreement("the neighbours disagree")
    return Agreement(AGREE, nearest[0][1])


def _env(device: str, device_type: str) -> dict[str, str]:
    import torch

    return {
        "device": device or device_type or "cuda",
        "torch": str(torch.__version__),
        "triton": dist_version("triton", "pytorch-triton", "pytorch-triton-rocm"),
        "cuda": str(torch.version.cuda or "none"),
        "hip": str(getattr(torch.version, "hip", None) or "none"),
    }


_NAME_SUFFIX = re.compile(r"_(?:\d+|[0-9a-f]{16})\Z")


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
    info = dict(info)
    # Transfer's, not the key's: the hash of every key stays what it was without them.
    info.pop(FAMILY_FIELD, None)
    info.pop(SIZES_FIELD, None)
    # The kernel's name without its suffix: a label for `tunecache stats`, and part of
    # the hash like every key field, so it must not carry what differs between graphs:
    # Inductor's per-graph counter, or the hash of the source that names a kernel when
    # kernels are shared (twins in and out of place have one key, and two names).
    name = _NAME_SUFFIX.sub("", str(info.pop("name", None) or "")) or "triton_kernel"
    env = _env(str(info.pop("device", None) or ""), str(info.get("device_type") or ""))
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


# What Inductor's saved dict holds besides the config's constexprs (AutotuneCache.save and
# _load_cached_autotuning, 2.11-2.14; the two warp-specialization fields where Triton has
# them). Every other field is one of the kernel's constexprs, or, where the kernel's
# source has no such argument, a Triton compile option (_create_compile_meta).
CONFIG_FIELDS = frozenset({
    "num_warps", "num_stages", "configs_hash", "found_by_coordesc", "time_taken_ms",
    "triton_cache_hash", "extra_options", "num_consumer_groups", "num_buffers_warp_spec",
})
# CUDA allows 1024 threads a block: 32 warps of 32 (16 of 64 on ROCm; its launch then
# fails and falls back). 64 passed Triton's compile and failed at launch (CUDA
# "invalid argument").
MAX_NUM_WARPS = 32
# Pipelining stages: Inductor's configs use 1-5; 16 ran correctly (Triton on CUDA). Also the
# bound of the mix-order reductions' NUM_STAGES constexpr, which coordinate descent tunes.
MAX_NUM_STAGES = 16
# Compile options Inductor's configs may carry as kwargs (num_ctas, maxnreg; waves_per_eu
# and its neighbours on ROCm), each (smallest, largest, power of two).
_OPTION_RANGES = {
    "num_ctas": (1, 16, True),
    "maxnreg": (1, 256, False),
    "waves_per_eu": (0, 8, False),
    "matrix_instr_nonkdim": (0, 32, False),
    "kpack": (1, 2, False),
}
# XBLOCK, YBLOCK, ZBLOCK, R0_BLOCK, R1_BLOCK, and a combo kernel's XBLOCK_0 ...:
# Inductor's block sizes, each capped by TRITON_MAX_BLOCK[prefix].
_INDUCTOR_BLOCK = re.compile(r"(X|Y|Z|R0_|R1_)BLOCK(_\d+)?\Z")


@functools.lru_cache(maxsize=1)
def _inductor_limits() -> tuple[dict[str, int], int, int]:
    """(TRITON_MAX_BLOCK, TRITON_MAX_RSPLIT, TRITON_MAX_TENSOR_NUMEL) of the installed
    torch (torch/_inductor/runtime/hints.py, 2.11-2.14: the limits of runtime autotuning,
    coordinate descent included); a torch without one gets 2**20, Triton's largest block."""
    try:
        from torch._inductor.runtime import hints
    except ImportError:  # pragma: no cover - tunecache.inductor needs torch
        hints = None
    numel = int(getattr(hints, "TRITON_MAX_TENSOR_NUMEL", 1 << 20))
    blocks = {str(k): int(v) for k, v in dict(getattr(hints, "TRITON_MAX_BLOCK", {})).items()}
    return blocks, int(getattr(hints, "TRITON_MAX_RSPLIT", numel)), numel


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _constexpr_problem(name: str, v: Any) -> str | None:
    """Why ``name=v`` is not a value Inductor's tuning could give a constexpr, or None.
    Each reason names the field and the rule, never the value, so that it is one warning
    however many kernels break it (remote.py)."""
    blocks, max_rsplit, max_numel = _inductor_limits()
    inductor_block = _INDUCTOR_BLOCK.match(name)
    if inductor_block or "BLOCK" in name.upper():
        if not _int(v) or not _is_pow2(v):
            return f"{name} is not a positive power of two"
        limit = blocks.get(inductor_block.group(1), max_numel) if inductor_block else max_numel
        if v > limit:
            return f"{name} is above Inductor's limit of {limit}"
    elif name == "RSPLIT":
        if not _int(v) or not 1 <= v <= max_rsplit:
            return f"RSPLIT is not an integer from 1 to {max_rsplit}"
    elif name == "NUM_STAGES":
        if not _int(v) or not 1 <= v <= MAX_NUM_STAGES:
            return f"NUM_STAGES is not an integer from 1 to {MAX_NUM_STAGES}"
    elif name in _OPTION_RANGES:
        low, high, pow2 = _OPTION_RANGES[name]
        if not _int(v) or not low <= v <= high or (pow2 and not _is_pow2(v)):
            return f"{name} is not {'a power of two' if pow2 else 'an integer'} from " \
                f"{low} to {high}"
    elif isinstance(v, bool) or v is None:
        pass
    elif isinstance(v, int):
        if abs(v) > 1 << 31:
            return f"{name} is not a 32-bit integer"
    elif isinstance(v, float):
        if not math.isfinite(v):
            return f"{name} is not a finite number"
    elif isinstance(v, str):
        if len(v) > 256:
            return f"{name} is a string over 256 characters"
    else:
        return f"{name} is not a number or a string"
    return None


def _launch_problem(num_warps: Any, num_stages: Any) -> str | None:
    if not _int(num_warps) or not (_is_pow2(num_warps) and num_warps <= MAX_NUM_WARPS):
        return f"num_warps is not a power of two from 1 to {MAX_NUM_WARPS}"
    if not _int(num_stages) or not 0 <= num_stages <= MAX_NUM_STAGES:
        return f"num_stages is not an integer from 0 to {MAX_NUM_STAGES}"
    return None


def triton_config_problem(value: Mapping[str, Any]) -> str | None:
    """Why a stored best-config dict is not one Inductor could have saved for any kernel,
    or None: ``num_warps`` a power of two up to 32, ``num_stages`` 0-16, ``configs_hash``
    a string, block sizes positive powers of two within Inductor's limits (TRITON_MAX_BLOCK
    by prefix, 2**20 for other ``*BLOCK*`` names), ``RSPLIT`` within TRITON_MAX_RSPLIT,
    compile options in range, the rest scalars. Whether the constexprs are the kernel's
    own is :func:`kernel_config_problem`'s, at the kernel's load."""
    if not isinstance(value.get("configs_hash"), str):
        return "configs_hash is not a string"
    launch = _launch_problem(value.get("num_warps"), value.get("num_stages"))
    if launch is not None:
        return launch
    for k, v in value.items():
        if k == "extra_options":
            if v is not None and not isinstance(v, dict):
                return "extra_options is not a dict"
        elif k == "found_by_coordesc":
            if not isinstance(v, bool):
                return "found_by_coordesc is not a bool"
        elif k in ("num_consumer_groups", "num_buffers_warp_spec"):
            if not _int(v) or not 0 <= v <= 64:
                return f"{k} is not an integer from 0 to 64"
        elif k not in CONFIG_FIELDS:
            problem = _constexpr_problem(k, v)
            if problem is not None:
                return problem
    return None


def kernel_config_problem(config: Any, own: Sequence[Any]) -> str | None:
    """Why ``config`` (a triton.Config read from a cache) is not one this kernel could
    have, or None. ``own``: the configs Inductor generated for the kernel.

    Its constexprs must be those of one of its own configs (without XBLOCK where that
    config has XBLOCK=1: cached_autotune drops it from a kernel with no x dimension),
    each of the same type, and every value within :func:`triton_config_problem`'s rules,
    unless it is the value one of the kernel's own configs has (a fixed config may go
    past the autotuning limits).
    """
    kwargs = dict(getattr(config, "kwargs", None) or {})
    num_warps = getattr(config, "num_warps", None)
    num_stages = getattr(config, "num_stages", None)
    launch = _launch_problem(num_warps, num_stages)
    if launch is not None and not any(
            (c.num_warps, c.num_stages) == (num_warps, num_stages) for c in own):
        return launch
    names = set(kwargs)
    # cached_autotune drops XBLOCK (always 1 there) from the configs of a kernel without
    # an x dimension, so a config saved for it has none.
    matching = [c for c in own if names == set(c.kwargs) or (
        c.kwargs.get("XBLOCK") == 1 and names == set(c.kwargs) - {"XBLOCK"})]
    if own and not matching:
        return "its constexpr names are not this kernel's"
    for k, v in kwargs.items():
        theirs = [c.kwargs[k] for c in matching]
        if any(type(t) is type(v) and t == v for t in theirs):
            continue
        if theirs and not any(type(t) is type(v) for t in theirs):
            return f"{k} is not of the type this kernel's configs give it"
        problem = _constexpr_problem(k, v)
        if problem is not None:
            return problem
    return None


def triton_entry_problem(
    timings: Mapping[str, float]
) -> tuple[dict[str, Any] | None, str | None]:
    """(the best-config dict of a stored entry, None), or (None, why it is refused).

    An entry holds exactly one candidate whose name is the canonical JSON of the dict
    ``AutotuneCache.save`` built (without ``time_taken_ms``). A shared database can hold
    anything, so every field Inductor turns into a Triton launch is checked
    (:func:`triton_config_problem`).
    """
    if len(timings) != 1:
        return None, "the entry does not hold exactly one config"
    (name,) = timings
    try:
        value = stored_json.loads(name, tc_keys.MAX_CANDIDATE_NAME)
    except stored_json.StoredJSONError:
        return None, "the entry is not JSON tunecache reads"
    if not isinstance(value, dict):
        return None, "the entry is not a JSON object"
    problem = triton_config_problem(value)
    if problem is not None:
        return None, problem
    value["time_taken_ms"] = int(timings[name]) if math.isfinite(timings[name]) else 0
    return value, None


def triton_config_from_entry(timings: Mapping[str, float]) -> dict[str, Any] | None:
    """The best-config dict of a stored entry, or None if it is not one we would write
    (:func:`triton_entry_problem`)."""
    return triton_entry_problem(timings)[0]


def coordesc_result(timings: Mapping[str, float]) -> dict[str, Any] | None:
    """:func:`triton_config_from_entry`, where that config is a coordinate-descent result."""
    best = triton_config_from_entry(timings)
    return best if best is not None and best.get("found_by_coordesc") else None


def config_fields(config: Any) -> dict[str, Any]:
    """What ``AutotuneCache.save`` stores of a triton.Config that names the config: its
    constexprs, num_warps and num_stages."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def config_text(best: Mapping[str, Any]) -> str:
    """A best-config dict as comparable text: the config, without what differs between
    two kernels that run the same config (their config lists' hash, their tuning time)."""
    return tc_keys.canonical_json({k: v for k, v in best.items()
                                   if k not in ("configs_hash", "time_taken_ms")})
