"""Which torch versions the Inductor hooks accept, the one error for an Inductor that
differs from what a hook was written against, and the one way tunecache says that a part
of it is off (each line once per process).

There is no upper bound on torch's version. Older than :data:`MIN_TORCH`: no Inductor part
is installed (one warning). Any other version: every part checks the internals it hooks
(their presence, the hooked methods' parameters, the shapes of what it reads) before it
installs anything, and raises :class:`InductorChanged` where they differ; that part stays
off, with one warning (:func:`warn_off`), and Inductor does that work as usual, while the
parts whose checks pass are on. On a torch newer than every version in
:data:`TESTED_TORCH` the job says once which versions were tested (:func:`untested`).
docs/decisions.md says why this is safe, and what a check cannot see.
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

__all__ = ["MIN_TORCH", "TESTED_TORCH", "LOOKUP_PARAMS", "PRECOMPILE_PARAMS",
           "PRECOMPILE_PARAMS_215", "InductorChanged", "inductor_config", "torch_release",
           "too_old", "untested", "say_untested", "param_names", "require", "warn_off",
           "explain_once", "kept_off", "turn_on"]

log = logging.getLogger("tunecache")


# Older than this: the hooks were never written for it; nothing Inductor is installed.
MIN_TORCH: tuple[int, int] = (2, 11)
# (major, minor) versions whose sources the hooks were read against and whose tests ran
# (CI: .ci/run). A newer one is probed part by part, and the job says this list once.
TESTED_TORCH: tuple[tuple[int, int], ...] = ((2, 11), (2, 12), (2, 13), (2, 14), (2, 15))

# The hooked methods' parameter names (2.11-2.14, then 2.15's, which passes the timing
# cache's key, ``benchmark_inputs_key``, beside the inputs key). Any other signature is
# refused rather than guessed at (one warning, Inductor's own behaviour).
LOOKUP_PARAMS = ("choices", "op", "inputs", "benchmark", "hint_override")
PRECOMPILE_PARAMS = ("choices", "name", "inputs_key", "precompilation_timeout_seconds")
PRECOMPILE_PARAMS_215 = ("choices", "name", "inputs_key", "benchmark_inputs_key",
                         "precompilation_timeout_seconds")


class InductorChanged(TypeError):
    """This torch's Inductor lacks an internal a hook needs, or has it with another
    signature: the part that needs it is not installed."""


def torch_release() -> tuple[int, int] | None:
    """(major, minor) of the torch imported here, None where its version does not read
    (a local build's string, say)."""
    import torch

    try:
        major, minor = str(torch.__version__).split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def too_old() -> str | None:
    """Why no Inductor part is installed on this torch (older than :data:`MIN_TORCH`),
    or None: every part then probes what it hooks."""
    import torch

    release = torch_release()
    if release is None or release >= MIN_TORCH:
        return None
    return (f"torch {torch.__version__} is older than {MIN_TORCH[0]}.{MIN_TORCH[1]}, "
            f"the oldest supported")


def _tested() -> str:
    low, high = TESTED_TORCH[0], TESTED_TORCH[-1]
    return f"{low[0]}.{low[1]}-{high[0]}.{high[1]}"


def untested() -> str | None:
    """The line saying that this torch is newer than every tested one (or its version
    does not read), or None where it is one of them or older."""
    import torch

    release = torch_release()
    if release is not None and release <= TESTED_TORCH[-1]:
        return None
    return (f"tunecache: torch {torch.__version__} is newer than the versions tunecache "
            f"was tested on ({_tested()}); each part checked the internals it hooks, "
            f"and one whose check failed is named as off")


def say_untested() -> None:
    """Say :func:`untested`'s line, once per process (a warning: the default logging
    shows nothing quieter, and this is the one sign that CI never ran this torch)."""
    line = untested()
    if line is not None:
        PROCESS.explain_once(logging.WARNING, "%s", line)


def inductor_config(new: str, old: str, default: Any) -> Any:
    """Inductor's config flag ``new``, or ``old`` on a torch that predates the rename
    (2.15 renamed ``benchmark_epilogue_fusion`` to ``benchmark_template_fusion`` and
    ``max_epilogue_benchmarked_choices`` to ``max_template_fusion_benchmarked_choices``;
    the old names are deprecated aliases there, which warn when read or set)."""
    from torch._inductor import config

    for name in (new, old):
        try:
            return getattr(config, name)
        except AttributeError:
            continue
    return default


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
