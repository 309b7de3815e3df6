"""The optional parts of the Inductor integration (narrowing, Triton sharing, compiled
graphs, compiled kernels): the one shape every installer has, and installing one.

A part is optional: where it cannot be installed (an Inductor that changed, a database it
cannot use, a bug), what it patched is undone back to the ledger's mark it started from,
one line says what the job goes without, and the GEMM hooks and the other parts go on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from .compat import warn_off

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..patching import Ledger
    from ..settings import Settings
    from .opener import CacheOpener

__all__ = ["Part", "Enable", "install"]

# enable(ledger, cache, settings, environment) -> whether the part is on. It decides from
# ``settings`` whether it applies; ``environment`` is TUNECACHE_* as Inductor's compile
# workers will read it (None where it does not parse: they could not use it); every
# attribute it sets on Inductor goes through ``ledger``.
Enable = Callable[["Ledger", "CacheOpener", "Settings", "Settings | None"], bool]


class Part(NamedTuple):
    """One optional part: how to turn it on and off, and what the job goes without when
    it cannot be turned on."""

    enable: Enable
    # Stops the part (what it patched is the ledger's to undo); returns whether it was on.
    disable: Callable[[], bool]
    off: str  # what tunecache then does not do (Inductor does it as usual)
    still: str = ""  # what is shared all the same
    # Run after the ledger is undone, for a part that was on.
    after_undo: Callable[[], None] | None = None


def install(part: Part, ledger: Ledger, cache: CacheOpener, settings: Settings,
            environment: Settings | None) -> bool:
    """Turn ``part`` on; returns whether it is. One that fails is stopped, undone back to
    the ledger's mark, and warned of once; an interruption (not an Exception) is let out
    after the same undo."""
    mark = ledger.mark()
    try:
        return part.enable(ledger, cache, settings, environment)
    except BaseException as e:
        try:
            part.disable()
        finally:
            ledger.undo(mark)
        if not isinstance(e, Exception):
            raise
        warn_off(part.off, e, part.still)
        return False
