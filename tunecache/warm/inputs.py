"""A recorded GEMM's inputs key (Inductor's ``inputs_key``): parsed into tensor specs and
checked against what warm's call for the op takes (no torch)."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Sequence

from .ops import ARITY

__all__ = ["Input", "parse_inputs", "check_inputs", "input_bytes", "MAX_INPUT_BYTES"]

# What warm may allocate for one key's inputs. The sizes come from the database, so a
# planted key could ask for any amount (10**15 elements) and end a nightly run out of
# memory; the largest GEMM inputs of real models are a few GiB (a 128256 x 8192 bf16
# vocabulary projection is 2 GiB), so a key past this is skipped, with its reason.
MAX_INPUT_BYTES = 8 << 30
# Bytes per element, by the dtype's name; warm builds a floating tensor through a float32
# one, so those count 4 more. A dtype not named here counts as 8 (warm refuses it later).
_ITEM_BYTES = {"torch.float16": 2, "torch.bfloat16": 2, "torch.float32": 4,
               "torch.float64": 8, "torch.int8": 1, "torch.uint8": 1, "torch.int16": 2,
               "torch.int32": 4, "torch.int64": 8, "torch.float8_e4m3fn": 1,
               "torch.float8_e5m2": 1}


@dataclasses.dataclass(frozen=True)
class Input:
    device_type: str
    dtype: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


def parse_inputs(inputs: str) -> list[Input]:
    """Inductor's inputs_key: repr of (device type, dtype, *sizes, *strides, offset) per
    input (AlgorithmSelectorCache.key_of, torch 2.11-2.14)."""
    # The key comes from shared storage: literal_eval runs no code, but deep nesting can
    # exhaust the parser's stack, so bound the text and catch those errors too.
    if len(inputs) > 4096:
        raise ValueError("inputs key is longer than any GEMM's (4096 characters)")
    try:
        raw = ast.literal_eval(inputs)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        raise ValueError(f"inputs key is not a Python literal: {e}") from None
    if not isinstance(raw, (list, tuple)):
        raise ValueError("inputs key is not a list")
    out = []
    for item in raw:
        if not isinstance(item, (list, tuple)) or len(item) < 3 or (len(item) - 3) % 2:
            raise ValueError(f"unexpected input {item!r}")
        device_type, dtype, *rest = item
        *dims, offset = rest
        n = len(dims) // 2
        if not all(isinstance(d, int) and d >= 0 for d in dims) or not isinstance(offset, int):
            raise ValueError(f"sizes/strides of {item!r} are not whole numbers (symbolic?)")
        out.append(Input(str(device_type), str(dtype), tuple(dims[:n]), tuple(dims[n:]),
                         offset))
    return out


def input_bytes(spec: Input) -> int:
    """What warm allocates for one input (its storage from offset 0, warm.build)."""
    extent = spec.offset + 1 + sum((s - 1) * st for s, st in zip(spec.size, spec.stride)
                                   if s > 0)
    item = _ITEM_BYTES.get(spec.dtype, 8)
    floating = "float" in spec.dtype
    return max(extent, 1) * (item + (4 if floating else 0))


def check_inputs(op: str, specs: Sequence[Input]) -> None:
    """Raise ValueError unless ``specs`` are inputs the call warm compiles for ``op`` can
    take and that lead Inductor to autotune ``op`` over exactly these inputs, within
    :data:`MAX_INPUT_BYTES`."""
    total = sum(input_bytes(s) for s in specs)
    if total > MAX_INPUT_BYTES:
        shown = f"{total >> 30} GiB" if total < 1 << 60 else "over 2**60 bytes"
        raise ValueError(f"its inputs take {shown}, more than the {MAX_INPUT_BYTES >> 30} "
                         "GiB warm allocates for one key")
    want = ARITY.get(op)
    if want is not None and len(specs) != want:
        raise ValueError(f"{op} takes {want} inputs, the inputs key has {len(specs)}")
    if op == "int_mm":
        a, b = specs
        if (a.dtype, b.dtype) != ("torch.int8", "torch.int8"):
            raise ValueError(f"int_mm needs int8 inputs, not {a.dtype} and {b.dtype}")
        if len(a.size) != 2 or len(b.size) != 2 or a.size[1] != b.size[0]:
            raise ValueError(f"int_mm inputs {a.size} x {b.size} do not multiply")
    elif op == "mm_plus_mm":
        a, b, c, d = specs
        if any(len(s.size) != 2 for s in specs):
            raise ValueError("mm_plus_mm inputs must all be matrices")
        if len({(s.device_type, s.dtype) for s in specs}) != 1:
            raise ValueError("mm_plus_mm inputs differ in device type or dtype")
        # tuned_mm_plus_mm (kernel/mm_plus_mm.py) autotunes only if a, c and b, d have the
        # same sizes and the product is not empty; otherwise it lowers to two "mm".
        if a.size != c.size or b.size != d.size or a.size[1] != b.size[0]:
            raise ValueError(f"mm_plus_mm inputs {a.size} x {b.size} + {c.size} x {d.size}"
                             " are not two products of equal sizes")
        if a.size[0] * b.size[1] == 0:
            raise ValueError("mm_plus_mm of an empty product is never autotuned")
