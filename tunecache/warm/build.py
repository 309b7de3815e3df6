"""Building what warm compiles for a recorded GEMM: its input tensors (views at the
recorded sizes, strides and offsets) and the one-op function (torch imported lazily)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .inputs import Input

__all__ = ["build_call", "device_for"]


def _make_base(spec: Input, device: Any) -> Any:
    """A 1-D tensor holding every element of ``spec``'s view (from storage offset 0)."""
    import torch

    dtype = getattr(torch, spec.dtype.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {spec.dtype}")
    extent = spec.offset + 1 + sum((s - 1) * st for s, st in zip(spec.size, spec.stride)
                                   if s > 0)
    if dtype.is_floating_point:
        return torch.randn(max(extent, 1), device=device).to(dtype)
    return torch.randint(-8, 8, (max(extent, 1),), device=device).to(dtype)


def _make_tensor(spec: Input, device: Any) -> Any:
    return _make_base(spec, device).as_strided(spec.size, spec.stride, spec.offset)


def build_call(op: str, specs: Sequence[Input], device: Any) -> tuple[Callable[..., Any],
                                                                       list[Any]]:
    """The function warm compiles for ``op`` and the arguments to call it with.

    An input recorded at a storage offset is passed as its whole storage and viewed inside
    the function: Inductor keys a graph input at offset 0 whatever its storage offset, but
    keys a view of an input (as a job's GEMM on a slice of a bigger buffer) at its offset.
    """
    import torch

    fn = _op_fn(op)
    if not any(s.offset for s in specs):
        return fn, [_make_tensor(s, device) for s in specs]
    views = [(s.size, s.stride, s.offset) if s.offset else None for s in specs]

    def viewed(*args: Any) -> Any:
        return fn(*(a if v is None else torch.as_strided(a, *v) for a, v in zip(args, views)))

    return viewed, [_make_base(s, device) if s.offset else _make_tensor(s, device)
                    for s in specs]


def _op_fn(op: str) -> Callable[..., Any]:
    """The one-op function whose compile autotunes ``op`` over its arguments, which are
    the tensors of the recorded inputs key in key order (see WARM_OPS)."""
    import torch

    if op == "mm_plus_mm":
        def mm_plus_mm(a: Any, b: Any, c: Any, d: Any) -> Any:
            # Exactly the post-grad pattern add(mm(a, b), mm(c, d)): each mm used once.
            return torch.mm(a, b) + torch.mm(c, d)

        return mm_plus_mm
    fns = {"mm": torch.mm, "addmm": torch.addmm, "bmm": torch.bmm, "baddbmm": torch.baddbmm,
           "int_mm": torch._int_mm}
    fn = fns[op]

    def gemm(*args: Any) -> Any:
        return fn(*args)

    return gemm


def device_for(device_type: str, local_rank: int) -> Any:
    import torch

    if device_type == "cpu":
        return torch.device("cpu")
    module = getattr(torch, device_type, None)
    if module is None or not module.is_available():
        raise RuntimeError(f"no {device_type} device on this machine")
    index = local_rank % max(1, module.device_count())
    return torch.device(device_type, index)
