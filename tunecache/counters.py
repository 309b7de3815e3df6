"""One typed view of what tunecache did in this process: :func:`stats`.

Each part counts where it works (the Inductor parts in their registry, users' kernels in
their sharing, compiled graphs, kernels and profiles in their signed services); this
module reads them all through the process's one owner, as copies the caller may keep.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .process import PROCESS

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .inductor.stats import Stats, TritonStats
    from .user_kernels.sharing import UserKernelStats

__all__ = ["ProcessStats", "ArtifactCounts", "stats", "reset_stats"]


@dataclasses.dataclass(frozen=True)
class ArtifactCounts:
    """Signed artifacts of one kind (compiled graphs, kernels, shape profiles) this
    process loaded from the database, found absent, refused, published, found present
    already, or replaced (an entry there that did not verify)."""

    loaded: int = 0
    absent: int = 0
    refused: int = 0
    published: int = 0
    present: int = 0
    replaced: int = 0

    @classmethod
    def of(cls, share: object) -> ArtifactCounts:
        counts = getattr(share, "counts", None) or {}
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in counts.items() if k in names})


@dataclasses.dataclass(frozen=True)
class ProcessStats:
    """What tunecache did in this process, part by part: ``gemm`` (GEMM autotuning: hits,
    benchmarks, narrowing, transfer), ``triton`` (Triton configs, coordinate descent,
    fusion and split-size benchmarks, epilogue-fusion decisions: the ``fusion_*``
    counters), ``graphs`` / ``kernels`` / ``profiles`` (signed artifacts) and
    ``user_kernels`` (users' @triton.autotune keys). Counters are since the process
    started or the last :func:`reset_stats`."""

    gemm: Stats
    triton: TritonStats
    graphs: ArtifactCounts
    kernels: ArtifactCounts
    profiles: ArtifactCounts
    user_kernels: UserKernelStats


def stats() -> ProcessStats:
    """This process's counters (copies; all zero for a part that never ran)."""
    from .inductor.state import REGISTRY
    from .user_kernels.sharing import UserKernelStats

    user = PROCESS.user_kernel_stats
    return ProcessStats(
        gemm=REGISTRY.stats.snapshot(),
        triton=REGISTRY.triton_stats.snapshot(),
        graphs=ArtifactCounts.of(REGISTRY.graphs),
        kernels=ArtifactCounts.of(PROCESS.kernels.share),
        profiles=ArtifactCounts.of(REGISTRY.pgo),
        user_kernels=dataclasses.replace(user) if user is not None else UserKernelStats(),
    )


def reset_stats() -> None:
    """Set the Inductor and user-kernel counters back to zero (those of signed artifacts
    are their services', which start afresh with each enable())."""
    from .inductor.state import REGISTRY

    REGISTRY.stats.reset()
    REGISTRY.triton_stats.reset()
    if PROCESS.user_kernel_stats is not None:
        PROCESS.user_kernel_stats.reset()
