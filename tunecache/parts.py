"""One part of tunecache: a hook point into Inductor, Dynamo or Triton that the switch
(:mod:`tunecache.switch`) turns on and off, and installing one.

Every wing is a part of the one switch: GEMM hooks, narrowing, Triton configs, fusion
decisions, compiled graphs, compiled kernels, shape profiles and users' autotuners. A part
is optional: where it cannot be installed (an internal it hooks is missing or changed, a
database it cannot use, a bug), what it patched is undone back to the ledger's mark it
started from, one line says what the job goes without, and the other parts go on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from .process import PROCESS

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .opener import CacheOpener
    from .patching import Ledger
    from .settings import Settings

__all__ = ["Part", "Enable", "install", "REMOTE_FLAGS"]

# The torch flags tunecache turns on, by (config module, name): the environment variable
# torch reads each from ("1" True, "0" False, unset None), and what tunecache shares
# through it. Each is set only where the user left it None; an explicit False is kept
# (tunecache/inductor/compat.py, `tunecache doctor`'s "remote flags" check). AOTAutograd's
# is never set: while it is None tunecache answers torch's question instead
# (tunecache/inductor/graphs.py).
REMOTE_FLAGS: dict[tuple[str, str], tuple[str, str]] = {
    ("torch._inductor.config", "fx_graph_remote_cache"):
        ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "compiled graphs"),
    ("torch._functorch.config", "enable_remote_autograd_cache"):
        ("TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE", "AOTAutograd entries"),
    ("torch._inductor.config", "autotune_remote_cache"):
        ("TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE", "Triton configs"),
    ("torch._dynamo.config", "automatic_dynamic_remote_pgo"):
        ("TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO", "Dynamo's shape profiles"),
}

# enable(ledger, opener, settings, environment) -> whether the part is on. It decides from
# ``settings`` whether it applies; ``environment`` is TUNECACHE_* as Inductor's compile
# workers will read it (None where it does not parse: they could not use it); every
# attribute it sets on another library goes through ``ledger``.
Enable = Callable[["Ledger", "CacheOpener", "Settings", "Settings | None"], bool]


class Part(NamedTuple):
    """One part: how to turn it on and off, and what the job goes without when it cannot
    be turned on (its name and the module it hooks are the switch's: tunecache.switch)."""

    enable: Enable
    # Stops the part (what it patched is the ledger's to undo); returns whether it was on.
    disable: Callable[[], bool]
    off: str  # what tunecache then does not do (Inductor or Triton does it as usual)
    still: str = ""  # what is shared all the same
    # Run after the ledger is undone, for a part that was on.
    after_undo: Callable[[], None] | None = None
    # Run once the process is found to compile (the GEMM part came on after this part),
    # for a part that behaves otherwise in Inductor's compile workers.
    compiling: Callable[[Ledger, Settings, Settings | None], None] | None = None
    # Raises (InductorChanged) where the internals the part hooks are not those it was
    # written against. enable calls it before patching anything (once its settings ask
    # for the part); `tunecache doctor` calls it alone. None: nothing to probe.
    probe: Callable[[], None] | None = None


def install(part: Part, ledger: Ledger, opener: CacheOpener, settings: Settings,
            environment: Settings | None, name: str = "") -> bool:
    """Turn ``part`` (the switch's ``name``) on; returns whether it is. One that fails is
    stopped, undone back to the ledger's mark, and warned of once, naming the part; an
    interruption (not an Exception) is let out after the same undo."""
    mark = ledger.mark()
    try:
        return part.enable(ledger, opener, settings, environment)
    except BaseException as e:
        try:
            part.disable()
        finally:
            ledger.undo(mark)
        if not isinstance(e, Exception):
            raise
        why = f"{type(e).__name__}: {e}"
        PROCESS.warn_off(part.off, f"the {name} part: {why}" if name else why, part.still)
        return False
