"""The registry of installed Inductor hooks: the one piece of mutable state of the
Inductor package, and what :func:`tunecache.inductor.disable` empties.

Every hook module reads and writes the registry's attributes instead of module globals,
so a reader finds everything that enable() changed in one object, and disable() can
undo it by emptying that object (tests/test_inductor.py checks that every patched
Inductor attribute is back).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .stats import Stats, TritonStats

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..core.graphs import GraphShare
    from .gemm import GemmHooks
    from .graphs import GraphPatch
    from .triton.install import TritonPatch
    from .triton.remote import TritonCache

__all__ = ["Registry", "REGISTRY"]


class Registry:
    """What the Inductor hooks installed in this process, and the counters they keep."""

    def __init__(self) -> None:
        self.stats = Stats()
        self.triton_stats = TritonStats()
        self.enable_lock = threading.Lock()
        # The GEMM selector hooks of the last enable() (tunecache.inductor.gemm); None
        # when disabled.
        self.hooks: GemmHooks | None = None
        # The Triton remote-cache adapter Inductor's calls reach (triton.remote); None
        # when Triton sharing is off.
        self.triton: TritonCache | None = None
        # What Triton sharing changed when it was enabled from the environment (a compile
        # worker, or the compiling process before the GEMM hooks take it over).
        self.triton_env_patch: TritonPatch | None = None
        self.triton_atexit = False  # the at-exit flush of held Triton results is registered
        # What triton.install replaced on Inductor's runtime classes: (owner, attribute,
        # its own value in __dict__); runtime_hooks_tried: whether this enable has tried to
        # install them (once: see triton.install.rekey_create).
        self.runtime_hooks: list[tuple[type, str, Any]] = []
        self.runtime_hooks_tried = False
        self.runtime_hooks_lock = threading.Lock()  # kernels may load on several threads
        # Per thread: .prefetching (in triton.split's search: a benchmark a peer is
        # running raises PeerMeasuring instead of waiting, and sets .left_to_peer to its
        # key), .wanted (measuring a split-size value ahead: whether the search may still
        # ask for it) and .benchmarking (inside a fusion benchmark: a kernel's config
        # decides the timing, so its coordinate descent waits for a peer instead of
        # deferring).
        self.fusion_local = threading.local()
        self.version_warned = False  # the unsupported-version warning was logged
        # Compiled-graph sharing (inductor.graphs): the service Inductor's remote FX graph
        # and AOTAutograd caches reach (None when off), and the lines on how to turn it
        # on, or why it is off, logged in this process (each once).
        self.graphs: GraphShare | None = None
        self.graph_patch: GraphPatch | None = None  # what enable_graphs changed
        self.graphs_explained: set[str] = set()
        # Facts of the process, kept across disable(): Inductor lowered a graph through
        # our hooks, and something (a GEMM, a Triton kernel, a compiled graph) asked for
        # the database; a job activated from TUNECACHE_DB that compiled but never asked
        # says so once at exit (switch.py), or the user sees nothing at all.
        self.compiled = False
        self.database_used = False
        self.nothing_shared_atexit = False


REGISTRY = Registry()


