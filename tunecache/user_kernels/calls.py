"""How `tunecache warm --user-kernels` calls a user's kernel again, on another Triton.

The process that tunes a key records the call in the entry's meta (field ``replay``):
each argument as a spec (a tensor's shape, strides and dtype; a number, bool, string or
None as it is) and, per config, the grid it launches with. A grid is usually a function
of the arguments and the config (``lambda meta: (cdiv(n, meta["BLOCK"]),)``), which no
database can hold, so it is evaluated for every config at record time. A call with an
argument of another kind (a tensor descriptor, an object) is not recorded, and warm
reports its key as skipped, with the reason.

:func:`rebuild` turns a stored spec back into a call on this machine's device, after
checking every field: the spec comes from the shared database, so it is bounded (argument
count, dimensions, bytes to allocate) and typed before anything is allocated. Tensors are
filled with normal noise (floating point) or zeros (integers and bools: an index tensor
of zeros stays in bounds). Timings on noise are what Triton's own benchmark measures
too: it runs the job's data through every config, but no data-dependent choice is kept.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .tuning_keys import config_id

__all__ = ["REPLAY", "describe", "rebuild", "Rebuilt", "ReplayError", "MAX_REPLAY_BYTES"]

REPLAY = "replay"
MAX_ARGS = 256
MAX_DIMS = 8
MAX_DIM = 2**31
MAX_STRING = 256
MAX_GRID = 2**31
# What the tensors of one rebuilt call may allocate in all.
MAX_REPLAY_BYTES = 16 * 2**30
_INT_BOUND = 2**63
# dtypes a spec may name (torch's names without "torch."), and the tensors warm can fill.
DTYPES = frozenset({
    "float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"})
# Keyword arguments of a launch that are not the kernel's: Triton's own.
_LAUNCH_KWARGS = frozenset({"grid", "warmup"})


class ReplayError(ValueError):
    """A stored spec warm will not rebuild, and why."""


def describe(args: Sequence[Any], kwargs: Mapping[str, Any], arg_names: Sequence[str],
             configs: Sequence[Any]) -> dict[str, Any] | None:
    """The spec of one call of an autotuner (its positional and keyword arguments, as
    ``Autotuner.run`` got them) for ``configs``, or None where warm could not rebuild it.
    Never raises: a call that cannot be described is only not re-tunable."""
    try:
        spec_args = [_spec(a) for a in args]
        named = {k: v for k, v in kwargs.items() if k not in _LAUNCH_KWARGS}
        spec_kwargs = {k: _spec(v) for k, v in named.items()}
        if None in spec_args or None in spec_kwargs.values() or len(spec_args) > MAX_ARGS:
            return None
        grid = kwargs.get("grid")
        bound = {**dict(zip(arg_names, args)), **named}
        grids: dict[str, list[int]] = {}
        for config in configs:
            found = _grid(grid(dict(bound, **config.all_kwargs())) if callable(grid) else grid)
            if found is None:
                return None
            grids[config_id(config)] = found
        return {"args": spec_args, "kwargs": spec_kwargs, "grids": grids}
    except Exception:  # noqa: BLE001 - a grid of the user's that fails here: not recorded
        return None


def _spec(value: Any) -> dict[str, Any] | None:
    if hasattr(value, "shape") and hasattr(value, "stride") and hasattr(value, "dtype"):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            return None
        return {"tensor": {"shape": [int(s) for s in value.shape],
                           "stride": [int(s) for s in value.stride()], "dtype": dtype}}
    return {"value": value} if _passable(value) else None


def _passable(value: Any) -> bool:
    """Whether a plain argument is one a spec holds as it is: None, a bool, a 64-bit int,
    a finite float or a short string (recorded and read back alike)."""
    return (value is None or isinstance(value, bool)
            or (isinstance(value, int) and -_INT_BOUND <= value < _INT_BOUND)
            or (isinstance(value, float) and math.isfinite(value))
            or (isinstance(value, str) and len(value) <= MAX_STRING))


def _grid(value: Any) -> list[int] | None:
    if not isinstance(value, (tuple, list)) or not 1 <= len(value) <= 3:
        return None
    if not all(type(v) is int and 0 <= v < MAX_GRID for v in value):
        return None
    return [*value, *[1] * (3 - len(value))]


@dataclasses.dataclass(frozen=True)
class Rebuilt:
    """A call ready to run: ``autotuner.run(*args, grid=grid, warmup=False, **kwargs)``."""

    args: list[Any]
    kwargs: dict[str, Any]
    grid: Callable[[Mapping[str, Any]], tuple[int, int, int]]


def rebuild(spec: Any, configs: Sequence[Any], device: Any) -> Rebuilt:
    """The call ``spec`` describes, on ``device``, for the kernel's ``configs``; raises
    ReplayError (nothing allocated) for a spec that is malformed, too large, or names a
    config the kernel does not have."""
    import torch

    if not isinstance(spec, dict):
        raise ReplayError("no recorded call")
    args, kwargs, grids = spec.get("args"), spec.get("kwargs"), spec.get("grids")
    if not (isinstance(args, list) and isinstance(kwargs, dict) and isinstance(grids, dict)):
        raise ReplayError("a recorded call without its arguments or grids")
    if len(args) + len(kwargs) > MAX_ARGS:
        raise ReplayError(f"more than {MAX_ARGS} arguments")
    checked = [_checked(a) for a in args]
    checked_kwargs = {_name(k): _checked(v) for k, v in kwargs.items()}
    total = sum(_bytes(c, torch) for c in [*checked, *checked_kwargs.values()])
    if total > MAX_REPLAY_BYTES:
        raise ReplayError(f"its tensors need {total} bytes, over {MAX_REPLAY_BYTES}")
    own = {config_id(c): c for c in configs}
    launch: list[tuple[dict[str, Any], tuple[int, int, int]]] = []
    for name, grid in grids.items():
        found = _grid(grid) if isinstance(name, str) else None
        if name not in own or found is None:
            raise ReplayError("a recorded grid of a config the kernel does not have")
        launch.append((own[name].kwargs, (found[0], found[1], found[2])))

    def grid_of(meta: Mapping[str, Any]) -> tuple[int, int, int]:
        for config_kwargs, grid in launch:
            if all(meta.get(k) == v for k, v in config_kwargs.items()):
                return grid
        raise ReplayError("a config launched without a recorded grid")

    return Rebuilt([_value(c, device, torch) for c in checked],
                   {k: _value(c, device, torch) for k, c in checked_kwargs.items()}, grid_of)


def _name(value: Any) -> str:
    if not (isinstance(value, str) and value.isidentifier()):
        raise ReplayError("an argument name that is not one")
    return value


def _checked(item: Any) -> dict[str, Any]:
    """One argument's spec, typed and bounded."""
    if not isinstance(item, dict) or len(item) != 1:
        raise ReplayError("an argument that is neither a tensor nor a value")
    if "value" in item:
        if _passable(item["value"]):
            return item
        raise ReplayError("an argument value of a kind or size warm does not pass")
    tensor = item.get("tensor")
    if not isinstance(tensor, dict):
        raise ReplayError("an argument that is neither a tensor nor a value")
    shape, stride, dtype = tensor.get("shape"), tensor.get("stride"), tensor.get("dtype")
    if not (isinstance(shape, list) and isinstance(stride, list)
            and len(shape) == len(stride) <= MAX_DIMS
            and all(type(s) is int and 0 <= s < MAX_DIM for s in [*shape, *stride])):
        raise ReplayError("a tensor of a shape or strides warm does not allocate")
    if dtype not in DTYPES:
        raise ReplayError(f"a tensor of dtype {str(dtype)[:40]!r}")
    return item


def _elements(tensor: Mapping[str, Any]) -> int:
    """How many elements the tensor's storage spans (strides may overlap or skip)."""
    shape, stride = tensor["shape"], tensor["stride"]
    if 0 in shape:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def _bytes(item: Mapping[str, Any], torch: Any) -> int:
    tensor = item.get("tensor")
    if tensor is None:
        return 0
    return _elements(tensor) * getattr(torch, tensor["dtype"]).itemsize


def _value(item: Mapping[str, Any], device: Any, torch: Any) -> Any:
    tensor = item.get("tensor")
    if tensor is None:
        return item["value"]
    dtype = getattr(torch, tensor["dtype"])
    storage = torch.zeros(_elements(tensor), dtype=dtype, device=device)
    if dtype.is_floating_point:
        storage.copy_(torch.randn(storage.shape, device=device))
    return storage.as_strided(tensor["shape"], tensor["stride"])
