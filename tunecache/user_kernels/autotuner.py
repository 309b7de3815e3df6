"""What tunecache changes on Triton's ``triton.runtime.autotuner.Autotuner``, and how it is
put back.

Read in Triton 3.6 and 3.8 (``triton/runtime/autotuner.py``). ``Autotuner.run`` keys a
tuning on the autotune key's argument values and every tensor argument's dtype; on a key
it has not seen in this process it prunes the configs (``prune_configs_by``) and, where
``self.cache_results`` is true, calls ``check_disk_cache(key, pruned_configs,
benchmark)``, which either fills ``self.cache[key]`` from a file (and returns True) or
calls ``benchmark()``; otherwise it calls ``benchmark()`` itself. ``benchmark`` runs every
pruned config with the autotuner's hooks (``reset_to_zero``, ``restore_value``,
``pre_hook``/``post_hook``), keeps the fastest in ``self.cache[key]`` and every time in
``self.configs_timings``. Triton offers no other place to decide a tuning from outside,
and its cache manager (``TRITON_CACHE_MANAGER``) sees only a file name, not the configs a
stored winner must be one of. So:

- ``cache_results`` reads true on every autotuner while tunecache is installed, so that
  every miss reaches ``check_disk_cache``, including autotuners built before tunecache
  was (a library imported before torch). Triton sets it in ``__init__``; what it sets is
  kept on the instance and is what runs when tunecache declines a key.
- ``check_disk_cache`` settles the key through the database
  (:meth:`.sharing.UserKernelSharing.settle`). It declines, leaving Triton's own
  behaviour, for an empty key (as Triton's file cache does) and for configs that only
  their hooks tell apart (lambdas of one name), whose stored winner could not be matched
  to one of them.
- ``run``: a stored winner that fails to compile or launch on its first call (a
  Triton or driver that differs from the publisher's in a way the key does not show) is
  dropped, with one warning, and the call runs again through Triton's own tuning.
  Compiling happens before anything is launched, so the call has changed nothing yet.
  Later calls of the key, and every other call, go straight to Triton's ``run``.

Hooks run as in Triton: a benchmark is Triton's own, and a stored winner is used the way
Triton uses a winner from its own file cache.

A key tuned here records how it was called (:mod:`.replay`), for `tunecache warm
--user-kernels` to call it again under another Triton. ``check_disk_cache`` is not given
the call's arguments; Triton's ``benchmark`` closure holds them (its free variables
``args`` and ``kwargs`` in 3.6 and 3.8), and is read only when the key is tuned here, so
launches pay nothing. A Triton whose closure holds them otherwise records no call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..inductor.compat import InductorChanged, param_names, require
from ..parts import Part
from ..process import PROCESS
from .calls import describe
from .sharing import UserKernelSharing, UserKernelStats
from .tuning_keys import distinct_ids, kernel_name, user_kernel_key

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..opener import CacheOpener
    from ..patching import Ledger
    from ..settings import Settings

__all__ = ["USER_KERNELS", "enable_user_kernels", "disable_user_kernels", "installed"]

log = logging.getLogger("tunecache")

# Per autotuner (in its __dict__, so that nothing outlives it): the tuning key whose
# stored winner has not launched yet, and the keys whose stored winners were dropped.
_PENDING = "_tunecache_pending"
_DROPPED = "_tunecache_dropped"


def installed() -> UserKernelSharing | None:
    """The sharing in place, or None."""
    sharing: UserKernelSharing | None = PROCESS.user_kernels
    return sharing


def probe_user_kernels() -> None:
    """Raise :class:`InductorChanged` where Triton's ``Autotuner`` lacks what sharing
    wraps (its run, its disk cache check and the ``cache_results`` flag)."""
    from triton.runtime.autotuner import Autotuner

    check = getattr(Autotuner, "check_disk_cache", None)
    require(("Autotuner.run", callable(getattr(Autotuner, "run", None))),
            ("Autotuner.check_disk_cache", callable(check)),
            ("Autotuner(cache_results=...)",
             "cache_results" in param_names(Autotuner.__init__)))
    if not callable(check) or param_names(check)[:3] != ("tuning_key", "configs", "bench_fn"):
        raise InductorChanged("Autotuner.check_disk_cache(tuning_key, configs, bench_fn) "
                              "changed")


def enable_user_kernels(ledger: Ledger, opener: CacheOpener, settings: Settings,
                        environment: Settings | None) -> bool:
    """Put tunecache in front of every Triton autotuner of this process, where
    ``settings`` share users' kernels; returns whether it is. Every change goes through
    ``ledger``."""
    if not settings.shares("user_kernels"):
        return False
    from triton.runtime.autotuner import Autotuner

    probe_user_kernels()
    if PROCESS.user_kernel_stats is None:
        PROCESS.user_kernel_stats = UserKernelStats()
    sharing = UserKernelSharing(settings, opener, PROCESS.user_kernel_stats)
    ledger.patch(Autotuner, "cache_results", property(_cache_results, _set_cache_results))
    ledger.patch(Autotuner, "check_disk_cache", _check_disk_cache(Autotuner.check_disk_cache))
    ledger.patch(Autotuner, "run", _run(Autotuner.run))
    PROCESS.user_kernels = sharing
    return True


def disable_user_kernels() -> bool:
    """Stop sharing (Triton's autotuner is the ledger's to give back); returns whether it
    was on."""
    sharing, PROCESS.user_kernels = PROCESS.user_kernels, None
    return sharing is not None


USER_KERNELS = Part(enable_user_kernels, disable_user_kernels,
                    "users' Triton kernels' autotuning is not shared",
                    "Triton autotunes them as usual", probe=probe_user_kernels)


def _cache_results(self: Any) -> bool:
    return True


def _set_cache_results(self: Any, value: bool) -> None:
    self.__dict__["cache_results"] = value  # Triton's own value, used where we decline


def _check_disk_cache(orig: Callable[..., bool]) -> Callable[..., bool]:
    def check_disk_cache(self: Any, tuning_key: Any, configs: Sequence[Any],
                         bench_fn: Callable[[], None]) -> bool:
        sharing = installed()
        if (sharing is None or not tuning_key or tuning_key in self.__dict__.get(_DROPPED, ())
                or not distinct_ids(configs)):
            return _as_triton(orig, self, tuning_key, configs, bench_fn)
        if not sharing.store_usable():
            sharing.count("local")
            return _as_triton(orig, self, tuning_key, configs, bench_fn)
        try:
            key = user_kernel_key(self, tuning_key, configs)
        except Exception as e:  # noqa: BLE001 - Triton's tuning still works
            sharing.warn_once(f"{kernel_name(self)}:key", "tunecache: user kernel %s not "
                              "shared: its key could not be built (%s: %s)",
                              kernel_name(self), type(e).__name__, e)
            return _as_triton(orig, self, tuning_key, configs, bench_fn)
        settled = sharing.settle(self, key, configs, bench_fn,
                                 lambda: _describe_call(self, configs, bench_fn))
        if settled is None:
            return False  # benchmarked here: Triton's benchmark set the winner
        self.cache[tuning_key] = settled.config
        self.configs_timings = {c: [ms] for c, ms in settled.timings.items()}
        self.__dict__[_PENDING] = tuning_key
        return True

    return check_disk_cache


def _describe_call(autotuner: Any, configs: Sequence[Any],
                   bench_fn: Callable[[], None]) -> dict[str, Any] | None:
    """The spec of the call being tuned, from Triton's ``benchmark`` closure, or None."""
    try:
        cells = dict(zip(bench_fn.__code__.co_freevars,
                         (c.cell_contents for c in bench_fn.__closure__ or ())))
    except (AttributeError, ValueError):  # not a closure, or a cell not yet filled
        return None
    args, kwargs = cells.get("args"), cells.get("kwargs")
    if not isinstance(args, tuple) or not isinstance(kwargs, dict):
        return None
    return describe(args, kwargs, autotuner.arg_names, configs)


def _as_triton(orig: Callable[..., bool], autotuner: Any, tuning_key: Any,
               configs: Sequence[Any], bench_fn: Callable[[], None]) -> bool:
    """What Triton does without tunecache: its file cache where the autotuner asked for
    it (``cache_results``, ``TRITON_CACHE_AUTOTUNING``), else a benchmark."""
    if autotuner.__dict__.get("cache_results"):
        return orig(autotuner, tuning_key, configs, bench_fn)
    bench_fn()
    return False


def _run(orig: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = orig(self, *args, **kwargs)
        except Exception as e:
            tuning_key = self.__dict__.pop(_PENDING, None)
            if tuning_key is None or tuning_key not in self.cache:
                raise
            sharing = installed()
            if sharing is not None:
                sharing.count("fallbacks")
                sharing.warn_once(f"{kernel_name(self)}:launch", "tunecache: user kernel %s: "
                                  "the stored config failed to compile or launch (%s: %s); "
                                  "Triton tunes it itself", kernel_name(self),
                                  type(e).__name__, e)
            del self.cache[tuning_key]
            self.__dict__.setdefault(_DROPPED, set()).add(tuning_key)
            return orig(self, *args, **kwargs)
        if _PENDING in self.__dict__:  # the stored winner launched: nothing left to watch
            del self.__dict__[_PENDING]
        return result

    return run
