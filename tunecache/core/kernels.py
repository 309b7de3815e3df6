"""Compiled Triton kernels shared through the database: one entry per kernel, the files
Triton's compile leaves for it (kind ``kernel``; tunecache.triton_cache packs them), as
signed artifacts (tunecache.core.signed_artifacts)."""

from __future__ import annotations

from .signed_artifacts import SignedArtifactShare

__all__ = ["KernelShare", "MAX_KERNEL_BYTES"]

# One kernel's files (source, ttir, ttgir, llir, ptx, cubin, json), packed. Measured with
# torch 2.11 and Triton 3.6 on an H200 over 89 kernels (GEMM templates under max-autotune,
# a transformer layer, flex attention with its backward, wide fusions): median 86 KB, GEMM
# templates up to 0.8 MB, flex attention's backward 1.9 MB, and the largest, a fusion of
# 64 inputs unrolled into one reduction, 13.2 MB (6.9 MB of it LLVM IR, 3.0 MB PTX,
# 2.8 MB cubin; 1.7 MB compressed). 256 MiB leaves about 20 times that for kernels that
# unroll further, and bounds what a bad entry can make a reader allocate 16 times lower
# than a graph's bound does.
MAX_KERNEL_BYTES = 256 * 2**20


class KernelShare(SignedArtifactShare):
    """Signed compiled Triton kernels in the shared database: Triton compiles a kernel
    whose entry is absent or refused."""

    noun = "compiled kernel"
    compiler = "Triton"
    max_bytes = MAX_KERNEL_BYTES

    def entry_name(self, kind: str, key: str) -> str:
        # One kind only, "kernel": the noun says it already.
        return f"{self.noun} {key[:24]}"
