"""Which torch versions the Inductor hooks support, the one error for an Inductor that
differs from what a hook was written against, and the one way tunecache says that a part
of it is off (each line once per process).

Supported torch versions: 2.11, 2.12, 2.13, 2.14. On any other version :func:`enable`
logs one warning and installs nothing, so Inductor behaves exactly as it would without
tunecache. The hooks were read in the 2.11, 2.13 and 2.14 sources and run on 2.13 (CPU);
every installer also checks the Inductor internals it hooks (their presence, the hooked
methods' signatures) and raises :class:`InductorChanged` where they differ, so a 2.12 or
a patched build that changed them is refused the same way: that part stays off, with one
warning (:func:`warn_off`), and Inductor does that work as usual.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..parts import REMOTE_FLAGS
from ..process import PROCESS

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..patching import Ledger

__all__ = ["SUPPORTED_TORCH", "LOOKUP_PARAMS", "PRECOMPILE_PARAMS", "InductorChanged",
           "unsupported", "param_names", "require", "warn_off", "explain_once",
           "kept_off", "turn_on"]

log = logging.getLogger("tunecache")


# (major, minor) bounds, inclusive. See the module docstring for what was checked.
SUPPORTED_TORCH: tuple[tuple[int, int], tuple[int, int]] = ((2, 11), (2, 14))

# The hooked methods' parameter names in every supported version. If a build differs, we
# refuse to hook rather than guess (one warning, Inductor's own behaviour).
LOOKUP_PARAMS = ("choices", "op", "inputs", "benchmark", "hint_override")
PRECOMPILE_PARAMS = ("choices", "name", "inputs_key", "precompilation_timeout_seconds")


class InductorChanged(TypeError):
    """This torch's Inductor lacks an internal a hook needs, or has it with another
    signature: the part that needs it is not installed."""


def unsupported() -> str | None:
    """Why this torch's version is not supported, or None where it is."""
    import torch

    low, high = SUPPORTED_TORCH
    try:
        version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        version = None
    if version is not None and low <= version <= high:
        return None
    return (f"torch {torch.__version__} is outside the supported "
            f"{low[0]}.{low[1]}-{high[0]}.{high[1]}")


def param_names(fn: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def require(*checks: tuple[str, bool]) -> None:
    """Raise :class:`InductorChanged` naming every internal whose check is false."""
    missing = [what for what, ok in checks if not ok]
    if missing:
        raise InductorChanged(f"this torch lacks {', '.join(missing)}")


def warn_off(off: str, why: BaseException | str, still: str = "") -> None:
    """:meth:`tunecache.process.Process.warn_off`."""
    PROCESS.warn_off(off, why, still)


def explain_once(level: int, message: str, *args: Any) -> None:
    """:meth:`tunecache.process.Process.explain_once`."""
    PROCESS.explain_once(level, message, *args)


def kept_off(owner: Any, name: str) -> bool:
    """Whether the user turned ``owner.name`` (one of :data:`~tunecache.parts.
    REMOTE_FLAGS`) off: an explicit False, in code or through its environment variable.
    It is kept, and said once."""
    if getattr(owner, name, None) is not False:
        return False
    variable, what = REMOTE_FLAGS[(owner.__name__, name)]
    explain_once(logging.INFO, "tunecache: %s are not shared: %s.%s is False (%s=0 or set "
                 "in code), and tunecache keeps it", what, owner.__name__, name, variable)
    return True


def turn_on(ledger: Ledger, owner: Any, name: str) -> bool:
    """``owner.name = True`` through ``ledger`` where the user left it None (unset), never
    over their True or False; returns whether the flag is on now."""
    if getattr(owner, name) is None:
        ledger.patch(owner, name, True)
    return bool(getattr(owner, name))
