"""The site of an epilogue-fusion decision, read from Inductor's scheduler nodes
(torch 2.11-2.14): what makes two decisions the same decision at another size or in
another graph (:mod:`.decisions`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...keys import Key
from ..compat import inductor_config
from ..fingerprint import environment
from .decisions import decision_key

__all__ = ["FusionSite", "fusion_site", "epilogue_structure"]


@dataclasses.dataclass(frozen=True)
class FusionSite:
    """``template``: the GEMM's MultiTemplateBuffer; ``fused``: the scheduler nodes of the
    template and its epilogue; ``key``: the decision's key (built once here); ``sizes``:
    the GEMM's sizes, by which sites of one structure are neighbours."""

    template: Any
    fused: list[Any]
    key: Key
    sizes: list[int]


def _ints(values: Any) -> list[int] | None:
    try:
        out = [int(v) for v in values]
    except TypeError:  # a symbolic size: dynamic shapes are not decided here
        return None
    return out


def _stride_order(stride: list[int]) -> list[int]:
    return sorted(range(len(stride)), key=lambda d: (stride[d], d))


def _coefficient(index: Any, var: Any) -> str:
    """How a loop variable moves an index: not at all, by 1, or by some stride (whose
    value follows from the sizes)."""
    if var not in index.free_symbols:
        return "0"
    return "1" if index.coeff(var) == 1 else "n"


def _read_pattern(dep: Any, template_buffers: set[str]) -> list[Any]:
    from torch._inductor.dependencies import MemoryDep
    from torch._inductor.virtualized import V

    source = "gemm" if dep.name in template_buffers else "other"
    try:
        dtype = str(V.graph.get_dtype(dep.name))
    except Exception:  # noqa: BLE001 - a name the graph does not know: dtype unknown
        dtype = "?"
    if not isinstance(dep, MemoryDep):
        return [source, dtype, type(dep).__name__]
    return [source, dtype, [_coefficient(dep.index, v) for v in dep.var_names]]


def epilogue_structure(nodes: list[Any], template_buffers: set[str]) -> list[Any] | None:
    """Each epilogue node's kind, reduction type, op counts, output dtype and reads (each
    read's source, dtype and how every loop variable moves its index), in scheduling
    order; nothing that depends on sizes or buffer names. One structure fits a persistent
    and a looped reduction alike: they differ in generated code, not in the IR."""
    out = []
    for node in nodes:
        body = getattr(node, "_body", None)
        ir_node = getattr(node, "node", None)
        if body is None or ir_node is None:
            return None
        reads = sorted((_read_pattern(d, template_buffers) for d in node.read_writes.reads),
                       key=repr)
        out.append({
            "reduction": str(ir_node.get_reduction_type()) if node.is_reduction() else None,
            "ops": sorted(body.op_counts.items()),
            "dtype": str(ir_node.get_dtype()),
            "reads": reads,
            "writes": len(node.read_writes.writes),
        })
    return out


def fusion_site(scheduler: Any, node1: Any, node2: Any) -> FusionSite | None:
    """The site where ``speedup_by_fusion(node1, node2)`` decides by benchmarks whether
    to fuse epilogue ``node2`` into GEMM template ``node1``; None for every other case
    (no MultiTemplateBuffer, a template with an epilogue already, prologues, atomic adds,
    layout conflicts, multi-kernel hints, dynamic sizes), which Inductor decides as
    without tunecache."""
    from torch._inductor import config, ir

    if config.multi_kernel_hints or not inductor_config(
            "benchmark_template_fusion", "benchmark_epilogue_fusion", False):
        return None
    if not node1.is_template() or node2.is_template() or node2.is_foreach():
        return None
    template = node1.get_template_node()
    if not isinstance(template, ir.MultiTemplateBuffer) or len(node1.get_nodes()) != 1:
        return None
    epilogue = list(node2.get_nodes())
    fused = [*node1.get_nodes(), *epilogue]
    if scheduler._any_atomic_add(fused) or scheduler._has_layout_conflict_for_template(template):
        return None
    device = template.get_device()
    if device is None or device.type == "cpu":
        return None
    inputs = []
    sizes: list[int] = []
    for buffer in template.inputs:
        size, stride = _ints(buffer.get_size()), _ints(buffer.get_stride())
        if size is None or stride is None:
            return None
        inputs.append([str(buffer.get_dtype()), len(size), _stride_order(stride)])
        sizes.extend(size)
    structure = epilogue_structure(epilogue, set(node1.get_buffer_names()))
    if structure is None:
        return None
    gemm = {"inputs": inputs, "dtype": str(template.get_dtype())}
    key = decision_key(environment(device.type), {"gemm": gemm, "epilogue": structure}, sizes)
    return FusionSite(template, fused, key, sizes)
