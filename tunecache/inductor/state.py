"""The Inductor parts' hook state: the registry the process's one owner
(:data:`tunecache.process.PROCESS`, as ``PROCESS.inductor``) holds for this package, and
the protocols that describe the hook objects it holds (the modules that define them
import this one).

Every hook module reads and writes the registry's attributes instead of module globals,
so a reader finds everything the Inductor parts keep in one object. Every attribute set on
Inductor goes through the process's patch ledger (``PROCESS.ledger``, tunecache/
patching.py), so disable() and every failure half-way through enabling undo exactly what
was done (tests/test_inductor.py checks that every patched Inductor attribute is back).
Module-level state elsewhere in the package is limited to memos of values that cannot
change in a process (a torch signature, the host's CPU model, our stand-in classes,
which must stay the same objects for the ledger's "still ours" check) and constants.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..process import PROCESS
from .stats import Stats, TritonStats

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..core.cache import TuneCache
    from ..core.graphs import GraphShare
    from ..core.pgo import ProfileShare
    from ..settings import Settings
    from .entries import GemmEntries
    from .triton.attempt import Attempt

__all__ = ["Registry", "REGISTRY", "InstalledGemmHooks", "InstalledTritonCache"]


# What the registry holds, described by what its readers call: the hook modules import
# this module, so it names their classes only through these protocols (mypy checks each
# class against its protocol where enable() stores an instance).

class InstalledOpener(Protocol):
    """The cache opener of the GEMM hooks (tunecache.inductor.opener.CacheOpener)."""

    @property
    def settings(self) -> Settings: ...
    def close(self) -> None: ...


class InstalledGemmHooks(Protocol):
    """The GEMM selector hooks (tunecache.inductor.gemm.GemmHooks), as narrowing and
    disable() read them."""

    count_only: bool
    entries: GemmEntries

    @property
    def opener(self) -> InstalledOpener | None: ...
    @property
    def broken(self) -> bool: ...
    def cache(self) -> TuneCache: ...
    def serving(self) -> bool: ...
    def warn_once(self, what: str, error: BaseException) -> None: ...


class InstalledTritonCache(Protocol):
    """The Triton remote-cache adapter (tunecache.inductor.triton.remote.TritonCache)."""

    worker: bool

    @property
    def cache(self) -> Callable[[], TuneCache]: ...
    def get(self, inductor_key: str, key_text: str) -> dict[str, Any] | None: ...
    def put(self, inductor_key: str, key_text: str, value: Any) -> None: ...
    def flush(self, thread: int | None = None) -> None: ...
    def warn_once(self, what: str, error: BaseException) -> None: ...
    def attempt(self, what: str) -> Attempt: ...
    def refuse(self, inductor_key: str, key_text: str, reason: str, config: Any) -> None: ...
    def served(self, key_text: str) -> dict[str, Any] | None: ...
    def stored_config_failed(self, inductor_key: str, key_text: str, doing: str,
                             error: BaseException) -> None: ...
    def stored_instead(self, inductor_key: str, key_text: str) -> dict[str, Any] | None: ...
    def plan_coordesc(self, inductor_key: str, key_text: str, *, waits: bool,
                      ahead: bool = False) -> tuple[str, dict[str, Any] | None]: ...
    def release_claim(self, inductor_key: str, key_text: str,
                      error: BaseException | str) -> None: ...
    def note_meta(self, inductor_key: str, key_text: str, **fields: Any) -> None: ...
    def drop_meta(self, inductor_key: str, key_text: str) -> None: ...
    def upgraded_from(self, key_hashes: list[str]) -> dict[str, str] | None: ...
    def transfer_sources(self, inductor_key: str, key_text: str,
                         limit: int = 2) -> list[tuple[str, dict[str, Any]]]: ...
    def decided_by_neighbours(self, inductor_key: str, key_text: str
                              ) -> tuple[dict[str, Any], list[str]] | None: ...
    def transfer_config_failed(self, inductor_key: str, key_text: str,
                               error: BaseException) -> None: ...
    def fusion_timing(self, key: Mapping[str, Any], *, waits: bool) -> tuple[str, Any]: ...
    def publish_fusion_ms(self, key: Mapping[str, Any], claim: Any, ms: float) -> float: ...


class Registry:
    """What the Inductor hooks installed in this process, and the counters they keep."""

    def __init__(self) -> None:
        self.stats = Stats()
        self.triton_stats = TritonStats()
        # The GEMM selector hooks of the last enable() (tunecache.inductor.gemm); None
        # when disabled.
        self.hooks: InstalledGemmHooks | None = None
        # The Triton remote-cache adapter Inductor's calls reach (triton.remote); None
        # when Triton sharing is off (it may be on without the GEMM hooks: enabled from
        # the environment in a compile worker, or in the compiling process before the
        # GEMM hooks take it over).
        self.triton: InstalledTritonCache | None = None
        self.triton_atexit = False  # the at-exit flush of held Triton results is registered
        # The runtime hooks on CachingAutotuner and CoordescTuner this enable has tried to
        # install, each once (triton.install.ensure_runtime_hooks).
        self.runtime_hooks: set[str] = set()
        self.runtime_hooks_lock = threading.Lock()  # kernels may load on several threads
        # Kernels whose coordinate descent waits for a peer's result with their launcher
        # fast path held off (triton.coordesc): disable() ends their wait.
        self.deferred_kernels: weakref.WeakSet[Any] = weakref.WeakSet()
        # Per thread: .prefetching (in triton.split's search: a benchmark a peer is
        # running raises PeerMeasuring instead of waiting, and sets .left_to_peer to its
        # key), .wanted (measuring a split-size value ahead: whether the search may still
        # ask for it), .benchmarking (inside a fusion benchmark: a kernel's config
        # decides the timing, so its coordinate descent waits for a peer instead of
        # deferring), .candidate (inside Scheduler.compile_kernel, for a module the
        # scheduler will benchmark: triton.candidates) and .decision (while an epilogue-
        # fusion decision is made: the list its benchmarks' timings go to, triton.replay).
        self.fusion_local = threading.local()
        # Per thread: .plans, what narrow.py's _finalize_template_configs kept in the
        # current get_template_configs call; narrowing_off: narrowing turned off after
        # its safety net found a mismatch (until the next enable()).
        self.gemm_local = threading.local()
        self.narrowing_off = False
        # Compiled-graph sharing (inductor.graphs): the service Inductor's remote FX graph
        # and AOTAutograd caches reach (None when off).
        self.graphs: GraphShare | None = None
        # Dynamo's shape profiles (inductor.pgo): the service its remote PGO cache
        # reaches (None when off).
        self.pgo: ProfileShare | None = None
        # Kernel names (inductor.kernel_sharing), per thread, .suffix: the content-derived
        # name suffix of the kernel TritonScheduling.define_kernel defines. Whether kernels
        # are shared is tunecache.triton_cache's (Triton names its manager class, so that
        # module owns the state it serves kernels from).
        self.kernel_names_local = threading.local()


if PROCESS.inductor is None:
    PROCESS.inductor = Registry()
# The registry, by the name every module of the package reads it by (the one object the
# process owner holds).
REGISTRY: Registry = PROCESS.inductor
