"""Users' own ``@triton.autotune`` kernels (Liger-Kernel's, flash-linear-attention's, a
team's own), tuned once per cluster with no code change (docs/user-kernels.md).

With ``TUNECACHE_DB`` set, the autoload hook (tunecache._autoload) calls
:func:`enable_from_env` right after ``triton.runtime.autotuner`` is imported, before any
kernel is decorated: every autotuner of the process then asks the database for a key
before benchmarking it, one process tunes each key while its peers wait, and the winner
and every config's time are stored (kind ``user_kernel``). ``TUNECACHE_USER_KERNELS=0``
leaves Triton's autotuner alone. :func:`enable` and :func:`disable` do the same by hand.

- keys.py: the key of one tuning, and a config's id;
- sharing.py: the tuning protocol for one key, the counters, the warnings;
- autotuner.py: what changes on Triton's ``Autotuner``, and how it is put back.
"""

from __future__ import annotations

import logging
from typing import Any

from ..settings import Settings

__all__ = ["enable", "enable_from_env", "disable", "stats"]

log = logging.getLogger("tunecache")


def enable(db: str | None = None, **overrides: Any) -> bool:
    """Share the tuning of every ``@triton.autotune`` kernel of this process through
    ``db`` (a path or URL; None: ``TUNECACHE_DB`` or the default), keyword arguments
    overriding the TUNECACHE_* variables as in :func:`tunecache.open`. True if sharing is
    on (it already was, or is now). Never raises: a problem is one warning, and Triton
    tunes as usual."""
    try:
        return _install(Settings.from_env(db=db, **overrides))
    except Exception as e:  # noqa: BLE001 - never break the user's job
        log.warning("tunecache: could not share users' Triton kernels' autotuning (%s: %s); "
                    "Triton autotunes them as usual", type(e).__name__, e)
        return False


def enable_from_env() -> None:
    """The autoload hook's entry: sharing with the settings of the environment. Raises
    what goes wrong: the hook reports a problem once, whichever of its targets (Inductor's
    modules, Triton's autotuner) meets it first, as a bad setting is met by all."""
    _install(Settings.from_env())


def _install(settings: Settings) -> bool:
    if settings.mode == "off" or not settings.user_kernels:
        return False
    from .autotuner import install

    install(settings)
    return True


def disable() -> None:
    """Give Triton's autotuner back as it was."""
    from .autotuner import uninstall

    uninstall()


def stats() -> dict[str, Any]:
    """This process's user-kernel counters (:class:`.sharing.UserKernelStats`); all zero
    while sharing is off."""
    from .autotuner import installed
    from .sharing import UserKernelStats

    sharing = installed()
    return (sharing.stats if sharing is not None else UserKernelStats()).as_dict()
