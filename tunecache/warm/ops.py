"""The GEMM ops ``tunecache warm`` can rebuild from a recorded key, and why the others are
not warmed (no torch, no database)."""

from __future__ import annotations

__all__ = ["WARM_OPS", "ARITY", "NOT_WARMED", "not_warmed_reason"]


# Op names as Inductor's lowerings pass them to the autotuner (torch 2.11-2.14), and the
# call warm compiles for each; its tensors come from the recorded inputs key, in key order.
WARM_OPS: dict[str, str] = {
    "mm": "torch.mm(a, b)",
    "addmm": "torch.addmm(bias, a, b)",
    "bmm": "torch.bmm(a, b)",
    "baddbmm": "torch.baddbmm(bias, a, b)",
    # kernel/mm.py tuned_int_mm (the aten._int_mm lowering): int8 x int8 -> int32.
    "int_mm": "torch._int_mm(a, b)",
    # kernel/mm_plus_mm.py tuned_mm_plus_mm is no aten lowering: the post-grad pattern
    # fx_passes/post_grad.py mm_plus_mm rewrites aten.add(aten.mm(a, b), aten.mm(c, d)),
    # the mm's used only by that add, when is_valid_mm_plus_mm holds (max_autotune or
    # max_autotune_gemm, and a:(M,K) b:(K,N) c:(M,K') d:(K',N)). tuned_mm_plus_mm then
    # autotunes "mm_plus_mm" over inputs (a, b, c, d) only if a, c and b, d have equal
    # sizes, M*N != 0 and triton.native_matmul is off; otherwise it lowers to two "mm".
    # The pattern has no device check and fires on CPU too, but there Inductor has a
    # single candidate (aten _mm_plus_mm; the Triton template needs a GPU or
    # cpu_backend="triton"), so it autotunes nothing and a CPU key comes out
    # not_autotuned. mm_plus_mm needs config.pattern_matcher (on by default).
    "mm_plus_mm": "torch.mm(a, b) + torch.mm(c, d)",
}

# Number of tensors in each op's inputs key (the nodes the lowering passes to the
# selector: kernel/mm.py, kernel/bmm.py, kernel/mm_plus_mm.py).
ARITY = {"mm": 2, "addmm": 3, "bmm": 2, "baddbmm": 3, "int_mm": 2, "mm_plus_mm": 4}

# Why other ops a job can record (every op that goes through Inductor's algorithm
# selector is a "gemm" key) are not warmed: warm can only compile a call it can rebuild
# from the inputs key alone.
NOT_WARMED: dict[str, str] = {
    "scaled_mm": "scaled_mm's out_dtype, use_fast_accum and scaling recipe are not in the "
                 "inputs key, so warm cannot rebuild the call",
    "packed_linear": "packed_linear needs a frozen nn.Linear whose weight Inductor packs; "
                     "the inputs key does not give the module",
    "_weight_int8pack_mm": "a weight-only quantized linear: the inputs key does not give "
                           "the packed weight and scales",
    "_weight_int4pack_mm_for_cpu": "a weight-only quantized linear: the inputs key does "
                                   "not give the packed weight and scales",
}


def not_warmed_reason(op: str) -> str:
    """Why a recorded key of ``op`` (not in WARM_OPS) is skipped."""
    reason = NOT_WARMED.get(op)
    if reason is None:
        reason = f"warm cannot rebuild a {op!r} call from its inputs key"
    return f"op {op!r} is not warmed: {reason} (warm covers {', '.join(WARM_OPS)})"
