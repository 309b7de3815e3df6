"""Turning the Inductor integration on and off: :func:`enable` installs the GEMM selector
hooks and the deferred pass, then each optional part (:data:`PARTS`: narrowing, Triton
sharing, compiled graphs, compiled kernels, Dynamo's shape profiles); :func:`disable`
stops the parts in reverse and undoes all of it."""

from __future__ import annotations

import atexit
import contextlib
import logging
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..settings import Settings, activation
from .compat import (
    LOOKUP_PARAMS,
    PRECOMPILE_PARAMS,
    InductorChanged,
    param_names,
    unsupported,
    warn_off,
)
from .deferred import make_pre_fusion_pass
from .gemm import GemmHooks
from .graphs import GRAPHS
from .kernel_sharing import KERNELS
from .narrow import install_narrowing
from .opener import CacheOpener
from .parts import Part, install
from .pgo import PGO
from .state import REGISTRY, InstalledGemmHooks
from .triton.install import TRITON
from .triton.worker import workers_settings

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .. import TuneCache

__all__ = ["enable", "disable", "is_enabled", "enable_from_env", "PARTS"]

log = logging.getLogger("tunecache")


def _stop_narrowing() -> bool:
    return False  # narrowing holds nothing but its patches, which are the ledger's


NARROWING = Part(install_narrowing, _stop_narrowing,
                 "a stored GEMM still generates all its template choices")

# The optional parts, in the order enable() installs them (after the GEMM hooks and the
# deferred pass, which every part relies on); disable() stops them in reverse.
PARTS: tuple[Part, ...] = (NARROWING, TRITON, GRAPHS, KERNELS, PGO)


def is_enabled() -> bool:
    """Whether the hooks are installed (in either mode)."""
    return REGISTRY.hooks is not None


def enable(
    cache: TuneCache | None = None, *, count_only: bool = False, **settings: Any
) -> bool:
    """Route Inductor's GEMM autotuning through tunecache; returns whether hooks are on.

    ``cache``: a ``tunecache.TuneCache`` to use; by default one is opened (lazily, at the
    first autotuned op) with ``tunecache.open(**settings)``, i.e. from TUNECACHE_* unless
    overridden. ``count_only=True`` installs only the benchmark counter (:data:`stats`),
    no cache. TUNECACHE_MODE=off enables nothing. Calling it again replaces the hooks.
    """
    reason = unsupported()
    if reason is not None:
        return _refuse(reason)
    chosen: Settings | None = None
    environment: Settings | None = None
    if not count_only:
        chosen = cache.settings if cache is not None else Settings.from_env(**settings)
        if chosen.mode == "off" and cache is None:
            log.info("tunecache: TUNECACHE_MODE=off, Inductor autotunes as usual")
            return False
        # TUNECACHE_* as Inductor's compile workers will read it: these very settings
        # where they came from the environment alone.
        environment = chosen if cache is None and not settings else workers_settings()

    from torch._inductor import select_algorithm

    selector = select_algorithm.get_algorithm_selector_cache()
    cls = type(selector)
    if param_names(cls.lookup) != LOOKUP_PARAMS or param_names(
        cls.make_precompile_fn
    ) != PRECOMPILE_PARAMS:
        return _refuse(InductorChanged(
            "AlgorithmSelectorCache.lookup/make_precompile_fn changed signature"))

    with REGISTRY.enable_lock:
        # Replaces the hooks of an earlier enable(), and takes over Triton sharing enabled
        # from the environment (autoload) before them.
        _disable_locked()
        opener = None if chosen is None else CacheOpener(chosen, cache)
        hooks = GemmHooks(selector, opener)
        try:
            _install_gemm_hooks(hooks, selector, cls)
            if opener is not None and chosen is not None:
                _install_pre_fusion_pass(hooks)
                for part in PARTS:
                    install(part, REGISTRY.patches, opener, chosen, environment)
        except BaseException:
            # Half-way: put back what was done, and let the error out as it came.
            _undo_locked(hooks)
            raise
        REGISTRY.hooks = hooks
    log.debug("tunecache: Inductor hooks installed (count_only=%s)", count_only)
    return True


def _refuse(why: BaseException | str) -> bool:
    warn_off("not enabled for Inductor", why, "Inductor autotunes as usual")
    return False


def _install_gemm_hooks(hooks: GemmHooks, selector: Any, cls: Any) -> None:
    """The selector's lookup and make_precompile_fn through ``hooks`` (count-only hooks
    too), through REGISTRY.patches."""
    patch = REGISTRY.patches.patch
    orig_lookup = cls.lookup.__get__(selector, cls)
    orig_precompile = cls.make_precompile_fn.__get__(selector, cls)

    def lookup(
        self: Any,
        choices: list[Any],
        op: str,
        inputs: str,
        benchmark: Callable[[Any], dict[Any, float]] | None,
        hint_override: int | None = None,
    ) -> dict[Any, float]:
        return hooks.lookup(orig_lookup, choices, op, inputs, benchmark, hint_override)

    def make_precompile_fn(
        self: Any,
        choices: list[Any],
        name: str,
        inputs_key: str,
        precompilation_timeout_seconds: int | None = 60 * 60,
    ) -> Callable[[], dict[Any, float]]:
        try:
            hooks.note_choices(choices, name, inputs_key)
        except Exception as e:  # noqa: BLE001 - only the deferred pass loses this op
            hooks.warn_once("recording a deferred GEMM", e)
        return orig_precompile(
            choices,
            name,
            inputs_key,
            precompilation_timeout_seconds=precompilation_timeout_seconds,
        )

    # Instance attributes over the class's methods: undone, the class's show through.
    patch(selector, "lookup", types.MethodType(lookup, selector))
    patch(selector, "make_precompile_fn", types.MethodType(make_precompile_fn, selector))


def _install_pre_fusion_pass(hooks: GemmHooks) -> None:
    """The deferred pass (a graph's deferred GEMMs in one go), in place of Inductor's own
    distributed GEMM autotuning, through REGISTRY.patches."""
    from torch._inductor import config

    patch = REGISTRY.patches.patch
    if getattr(config, "distributed_max_autotune_gemm", False):
        patch(config, "distributed_max_autotune_gemm", False)
        log.info(
            "tunecache: turned off torch._inductor.config.distributed_max_autotune_gemm; "
            "tunecache shares GEMM autotuning across ranks and jobs instead"
        )
    patch(config, "_pre_fusion_custom_pass",
          make_pre_fusion_pass(hooks, config._pre_fusion_custom_pass))


def _disable_locked() -> None:
    hooks, REGISTRY.hooks = REGISTRY.hooks, None
    _undo_locked(hooks)


def _undo_locked(hooks: InstalledGemmHooks | None) -> None:
    """Stop every part (the newest first), undo every patch in the ledger (newest first),
    run what a part that was on needs once its patches are gone, and close the hooks'
    cache. Each step runs even where one before it failed (Triton's flush of held
    results may); the failure is raised at the end."""
    stopped: list[Part] = []

    def stop(part: Part) -> None:
        if part.disable():
            stopped.append(part)

    def after_undo() -> None:
        for part in stopped:
            if part.after_undo is not None:
                part.after_undo()

    def close() -> None:
        if hooks is not None and hooks.opener is not None:
            hooks.opener.close()

    # An ExitStack runs its callbacks last pushed first, each whatever the others raised.
    with contextlib.ExitStack() as steps:
        steps.callback(close)
        steps.callback(after_undo)
        steps.callback(REGISTRY.patches.undo)
        for part in PARTS:
            steps.callback(stop, part)


def disable() -> None:
    """Remove the hooks (Inductor's own autotuning again) and close the cache we opened:
    every attribute tunecache set on Inductor is back, Triton sharing enabled from the
    environment included."""
    with REGISTRY.enable_lock:
        _disable_locked()


def enable_from_env() -> None:
    """Called by the autoload hook (tunecache._autoload) once select_algorithm exists."""
    if activation().count_only:
        enable(count_only=True)
    elif enable():
        with REGISTRY.enable_lock:
            hooks = REGISTRY.hooks
            if hooks is not None and hooks.opener is not None \
                    and not REGISTRY.nothing_shared_atexit:
                REGISTRY.nothing_shared_atexit = True
                # The settings that enable() just read from the environment.
                atexit.register(_say_if_nothing_shared, hooks.opener.settings)


# What max-autotune benchmarks, for the line below and the README's "What autotunes where".
_WHAT_AUTOTUNES = ("on a GPU every mm, addmm, bmm and other GEMM autotunes; on a CPU only "
                   "bmm, and nn.Linear under torch._inductor.config.freezing=True")


def _say_if_nothing_shared(settings: Settings) -> None:
    """At exit of a job activated by TUNECACHE_DB: if Inductor compiled here but nothing
    ever asked for the database, say so in one visible line. Otherwise the job stores
    nothing, creates no database and prints nothing (the "no key" line is info), and the
    user cannot tell a working setup from one that does nothing. At exit rather than after
    each compile: a later compile of the same job may still autotune."""
    if not REGISTRY.compiled or REGISTRY.database_used:
        return
    try:
        from sqlalchemy.engine import make_url

        url = make_url(settings.db_url)
        where = url.database if url.get_backend_name() == "sqlite" else \
            url.render_as_string(hide_password=True)
        graphs = ("; compiled graphs are shared only with TUNECACHE_SIGNING_KEY"
                  if settings.graph_sharing().state == "unconfigured" else "")
        log.warning("tunecache: this job found nothing to share in %s: nothing it compiled "
                    "was autotuned, so no key was looked up or published (%s)%s",
                    where, _WHAT_AUTOTUNES, graphs)
    except Exception as e:  # noqa: BLE001 - never fail the job's exit
        log.debug("tunecache: could not report an unused database: %r", e)
