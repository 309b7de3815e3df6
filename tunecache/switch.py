"""Turning tunecache on and off: every part, one switch.

The parts, in the order they are turned on (:data:`PARTS`; off in reverse): users'
``@triton.autotune`` kernels, Triton configs, the GEMM hooks, narrowing, fusion decisions,
compiled graphs, compiled kernels and Dynamo's shape profiles. Each is installed once the
module it hooks is imported: :func:`enable` imports them (tunecache.enable()); the autoload
hook (tunecache._autoload) asks :func:`enable_target` for the parts of each module as it is
imported, with the settings it read once (:func:`autoload`). Everything goes through the
process's one owner (:data:`tunecache.process.PROCESS`): its ledger, its cache opener, its
record of what is on. :func:`disable` stops every part and gives back every patch, Triton's
``Autotuner`` included.

This module imports nothing heavy: the parts are named by module and loaded when their
target is there.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import ConfigError
from .parts import Part, install
from .process import PROCESS
from .settings import Settings

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .core.cache import TuneCache

__all__ = ["PARTS", "TARGETS", "enable", "disable", "is_enabled", "enable_target",
           "autoload", "parts_on", "MANAGER_VAR", "MANAGER"]

log = logging.getLogger("tunecache")

SELECT = "torch._inductor.select_algorithm"
# Narrowing wraps InductorChoices: a job (or a custom choices subclass) may import this
# module first, and it imports select_algorithm while only half initialised itself.
CHOICES = "torch._inductor.choices"
AUTOTUNE_CACHE = "torch._inductor.runtime.autotune_cache"
AUTOTUNER = "triton.runtime.autotuner"

# tunecache.triton_cache's manager, named here without importing it (or Triton).
MANAGER_VAR = "TRITON_CACHE_MANAGER"
MANAGER = "tunecache.triton_cache:KernelCacheManager"


class PartEntry(NamedTuple):
    """A part as the switch knows it before it is loaded: its name, the module whose
    import lets it install, where its :class:`Part` is (``module:attribute``), and what
    it is, for the line that says everything is off."""

    name: str
    target: str
    where: str
    what: str


PARTS: tuple[PartEntry, ...] = (
    PartEntry("user_kernels", AUTOTUNER, "tunecache.user_kernels.autotuner:USER_KERNELS",
              "users' Triton kernels"),
    PartEntry("triton", AUTOTUNE_CACHE, "tunecache.inductor.triton.install:TRITON",
              "Triton configs"),
    PartEntry("gemm", SELECT, "tunecache.inductor.gemm_hooks:GEMM", "GEMM autotuning"),
    PartEntry("narrowing", CHOICES, "tunecache.inductor.narrow:NARROWING",
              "narrowed GEMM choices"),
    PartEntry("fusion", SELECT, "tunecache.inductor.triton.install:FUSION",
              "fusion decisions"),
    PartEntry("graphs", SELECT, "tunecache.inductor.graphs:GRAPHS", "compiled graphs"),
    PartEntry("kernels", SELECT, "tunecache.inductor.kernel_sharing:KERNELS",
              "compiled kernels"),
    PartEntry("profiles", SELECT, "tunecache.inductor.pgo:PGO", "shape profiles"),
)
TARGETS: tuple[str, ...] = tuple(dict.fromkeys(p.target for p in PARTS))
_INDUCTOR_TARGETS = (AUTOTUNE_CACHE, SELECT, CHOICES)


def _wanted(entry: PartEntry, settings: Settings) -> bool:
    """Whether ``settings`` ask for the part at all (the part decides the rest: a key,
    the mode, what the installed libraries offer)."""
    if entry.name in ("user_kernels", "triton"):
        return settings.shares(entry.name)
    if entry.name == "fusion":
        return settings.shares("triton")
    return True


def _load(entry: PartEntry) -> Part:
    module, attribute = entry.where.split(":")
    part: Part = getattr(importlib.import_module(module), attribute)
    return part


def parts_on() -> list[str]:
    """The names of the parts that are on, in the order they came on."""
    with PROCESS.lock:
        return list(PROCESS.on)


def is_enabled() -> bool:
    """Whether any part is on."""
    return bool(PROCESS.on)


def enable(cache: TuneCache | None = None, *, count_only: bool = False,
           only: Collection[str] | None = None, **settings: Any) -> bool:
    """Turn every part on in this process; returns whether the GEMM part is on.

    ``cache``: a ``tunecache.TuneCache`` every part uses (the caller keeps owning it); by
    default one is opened at the first use from ``settings`` (keyword arguments over the
    TUNECACHE_* variables, as for :func:`tunecache.open`). ``count_only=True`` installs
    only the GEMM benchmark counter, no cache (benchmark tools); ``only``: the names of
    the parts to turn on (all by default; ``tunecache warm --user-kernels`` turns on its
    own). TUNECACHE_MODE=off turns nothing on. Calling it again replaces what is on.
    """
    chosen: Settings | None = None
    if not count_only:
        chosen = cache.settings if cache is not None else Settings.from_env(**settings)
        PROCESS.say_notices(chosen)
        if chosen.mode == "off" and cache is None:
            log.info("tunecache: TUNECACHE_MODE=off, Inductor autotunes as usual")
            return False
    with PROCESS.lock:
        _disable_locked()
        if chosen is None:
            return _install_count_only()
        PROCESS.settings = chosen
        # TUNECACHE_* as Inductor's compile workers will read it: these very settings
        # where they came from the environment alone.
        environment = chosen if cache is None and not settings else _workers_settings()
        PROCESS.cache_opener(chosen, cache)
        wanted = {p.name for p in PARTS} if only is None else set(only)
        try:
            for target in TARGETS:
                if any(p.target == target and p.name in wanted for p in PARTS) \
                        and _importable(target):
                    _enable_target_locked(target, chosen, environment, wanted)
        except BaseException:
            _disable_locked()  # half-way: put back what was done, and let it out
            raise
        return bool(PROCESS.on) if only is not None else "gemm" in PROCESS.on


def _install_count_only() -> bool:
    from .inductor.compat import say_untested, too_old
    from .inductor.gemm_hooks import enable_gemm

    reason = too_old()
    if reason is not None:
        PROCESS.warn_off("not enabled for Inductor", reason, "Inductor autotunes as usual")
        return False
    say_untested()
    mark = PROCESS.ledger.mark()
    try:
        enable_gemm(PROCESS.ledger, None, None, None)
    except BaseException:
        PROCESS.ledger.undo(mark)
        raise
    PROCESS.on.append("gemm")
    return True


def _workers_settings() -> Settings | None:
    try:
        return Settings.from_env()
    except ConfigError:
        return None


def _importable(target: str) -> bool:
    """Import ``target`` (tunecache.enable() installs every part whose library is
    there); False where it is not installed."""
    try:
        importlib.import_module(target)
        return True
    except ImportError:
        return False


def enable_target(target: str) -> None:
    """The autoload hook's entry, once ``target`` has been imported: turn on the parts of
    that module, with the settings :func:`autoload` read."""
    with PROCESS.lock:
        settings = PROCESS.settings
        if settings is None or target in PROCESS.targets_done:
            return
        PROCESS.targets_done.add(target)
        _enable_target_locked(target, settings, settings, {p.name for p in PARTS})
        if target == SELECT and "gemm" in PROCESS.on \
                and not PROCESS.nothing_shared_atexit:
            PROCESS.nothing_shared_atexit = True
            atexit.register(_say_if_nothing_shared, settings)


def _enable_target_locked(target: str, settings: Settings, environment: Settings | None,
                          wanted: Collection[str]) -> None:
    if target in _INDUCTOR_TARGETS:
        from .inductor.compat import say_untested, too_old

        reason = too_old()
        if reason is not None:
            PROCESS.warn_off("not enabled for Inductor", reason,
                             "Inductor autotunes as usual")
            return
        # No upper bound: each part below probes what it hooks (tunecache.parts.install).
        say_untested()
    opener = PROCESS.cache_opener(settings)
    for entry in PARTS:
        if entry.target != target or entry.name in PROCESS.on \
                or entry.name not in wanted or not _wanted(entry, settings):
            continue
        if target in (SELECT, CHOICES) and entry.name != "gemm" and "gemm" not in PROCESS.on:
            break  # every Inductor part relies on the GEMM hooks
        part = _load(entry)
        if install(part, PROCESS.ledger, opener, settings, environment, entry.name):
            PROCESS.on.append(entry.name)
            if entry.name == "gemm":
                _now_compiling(settings, environment)


def _now_compiling(settings: Settings, environment: Settings | None) -> None:
    """The GEMM part came on: this process compiles. Its cache falls back to Inductor's
    own behaviour rather than reopening, and the parts that behave otherwise in a compile
    worker become the compiling process's."""
    if PROCESS.opener is not None:
        PROCESS.opener.retry_seconds = None
    for entry in PARTS:
        if entry.name in PROCESS.on:
            part = _load(entry)
            if part.compiling is not None:
                try:
                    part.compiling(PROCESS.ledger, settings, environment)
                except Exception as e:  # noqa: BLE001 - that part stays a worker's
                    PROCESS.warn_off(part.off, e, part.still)


def disable() -> None:
    """Turn every part off: every attribute tunecache set on Inductor, Dynamo and Triton
    is back, and the cache tunecache opened is closed."""
    with PROCESS.lock:
        _disable_locked()


def _disable_locked() -> None:
    """Stop every part (the newest first), undo every patch in the ledger (newest first),
    run what a part that was on needs once its patches are gone, close the process's
    cache and its compile-ahead threads. Each step runs even where one before it failed
    (Triton's flush of held results may); the failure is raised at the end."""
    names, PROCESS.on = PROCESS.on, []
    stopped: list[Part] = []

    def stop(part: Part) -> None:
        if part.disable():
            stopped.append(part)

    def after_undo() -> None:
        for part in stopped:
            if part.after_undo is not None:
                part.after_undo()

    def close() -> None:
        pool, PROCESS.compile_pool = PROCESS.compile_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        PROCESS.close_opener()

    # An ExitStack runs its callbacks last pushed first, each whatever the others raised.
    with contextlib.ExitStack() as steps:
        steps.callback(close)
        steps.callback(after_undo)
        steps.callback(PROCESS.ledger.undo)
        for entry in PARTS:
            if entry.name in names:
                steps.callback(stop, _load(entry))


def autoload() -> tuple[str, ...]:
    """Read the settings once, for the autoload hook, and return the modules whose import
    it waits for; () where tunecache is off in this job. A bad setting turns every part
    off, said once in one line that names them."""
    try:
        settings = Settings.from_env()
    except ConfigError as e:
        what = [p.what for p in PARTS]
        PROCESS.explain_once(
            logging.WARNING, "tunecache is off in this job: %s; %s and %s are tuned and "
            "compiled as without tunecache", e, ", ".join(what[:-1]), what[-1])
        return ()
    PROCESS.say_notices(settings)
    if settings.mode == "off":
        return ()
    with PROCESS.lock:
        PROCESS.settings = settings
    if settings.kernel_sharing().state in ("publish", "verify") \
            and not os.environ.get(MANAGER_VAR):
        # Before Inductor's compile workers start: they copy the environment once.
        os.environ[MANAGER_VAR] = MANAGER
    return tuple(dict.fromkeys(p.target for p in PARTS if _wanted(p, settings)))


# What max-autotune benchmarks, for the line below and the README's "What autotunes where".
_WHAT_AUTOTUNES = ("on a GPU every mm, addmm, bmm and other GEMM autotunes; on a CPU only "
                   "bmm, and nn.Linear under torch._inductor.config.freezing=True")


def _say_if_nothing_shared(settings: Settings) -> None:
    """At exit of a job activated by TUNECACHE_DB: if Inductor compiled here but nothing
    ever asked for the database, say so in one visible line. Otherwise the job stores
    nothing, creates no database and prints nothing (the "no key" line is info), and the
    user cannot tell a working setup from one that does nothing. At exit rather than after
    each compile: a later compile of the same job may still autotune."""
    if not PROCESS.compiled or PROCESS.database_used:
        return
    try:
        from sqlalchemy.engine import make_url

        url = make_url(settings.db_url)
        where = url.database if url.get_backend_name() == "sqlite" else \
            url.render_as_string(hide_password=True)
        graphs = ("; compiled graphs are shared only with TUNECACHE_SIGNING_KEY"
                  if settings.graph_sharing().state == "unconfigured" else "")
        why = ("its GEMMs were autotuned through a lookup patched over tunecache's "
               "(AlgorithmSelectorCache.lookup), so no key was looked up or published"
               if PROCESS.gemm_stood_aside else
               "nothing it compiled was autotuned, so no key was looked up or published "
               f"({_WHAT_AUTOTUNES})")
        log.warning("tunecache: this job found nothing to share in %s: %s%s", where, why,
                    graphs)
    except Exception as e:  # noqa: BLE001 - never fail the job's exit
        log.debug("tunecache: could not report an unused database: %r", e)
