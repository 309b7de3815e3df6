"""The one owner of tunecache's state in a process: :data:`PROCESS`.

Everything tunecache changes or keeps while it is enabled lives in this one object, as
SQLAlchemy's ``Engine`` owns its pool and ``logging`` has one manager of every logger:
the settings read once, the one patch ledger (every attribute set on Inductor, Dynamo or
Triton), the one cache opener (so that a process and each of Inductor's compile workers
open one ``TuneCache``, whatever is on), which parts are on, the state each part keeps
(the Inductor hooks' registry, the compiled-kernel service, users' autotuner sharing, the
compile-ahead threads) and what has been explained to the user. The switch
(:mod:`tunecache.switch`) turns parts on and off through it, and ``disable()`` gives all of
it back.

It imports nothing heavy (no torch, Triton or SQLAlchemy): the autoload hook reads it at
``import torch``. What a part keeps is typed by the part's own module, which imports this
one; here it is only held.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .patching import Ledger

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .core.cache import TuneCache
    from .opener import CacheOpener
    from .settings import Settings

__all__ = ["Process", "PROCESS", "KernelService"]

log = logging.getLogger("tunecache")


class KernelService:
    """Compiled-kernel sharing in this process (tunecache.triton_cache): Triton names its
    cache manager class, never an instance, so the manager reaches this state here."""

    def __init__(self) -> None:
        # Held while the service is built: a thread that asks meanwhile waits for it
        # rather than compiling a kernel it could have loaded.
        self.lock = threading.Lock()
        self.built = False
        self.share: Any = None  # tunecache.core.kernels.KernelShare, or None: not shared
        # serve() is in effect (the enabling process named the manager), and
        # TRITON_CACHE_MANAGER's value before it (None: unset).
        self.serving = False
        self.manager_was: str | None = None
        # Keys publish_kept has handled: Inductor may keep one launcher more than once.
        self.kept: set[str] = set()


class Process:
    """What tunecache holds in this process (see the module docstring)."""

    def __init__(self) -> None:
        # Held while parts are turned on or off.
        self.lock = threading.RLock()
        # Every attribute tunecache set on another library, with what it replaced; undone
        # by disable(), or back to a part's own entries when that part stops.
        self.ledger = Ledger()
        # The settings the autoload hook read from the environment (once), or those of
        # the last tunecache.enable(); None before either.
        self.settings: Settings | None = None
        # The one cache opener of the process: every part reaches the database through
        # it (None until a part needs one).
        self.opener: CacheOpener | None = None
        # The parts that are on, by name, in the order they were turned on.
        self.on: list[str] = []
        # The import targets the autoload hook has handled.
        self.targets_done: set[str] = set()
        # The lines already logged on why something is off, or how to turn it on.
        self.explained: set[str] = set()
        # The Inductor integration's hook registry (tunecache.inductor.state.Registry),
        # made by that package when it is first imported.
        self.inductor: Any = None
        self.kernels = KernelService()
        # Users' @triton.autotune sharing (tunecache.user_kernels.sharing), while on, and
        # its counters, which outlive it (tunecache.stats()).
        self.user_kernels: Any = None
        self.user_kernel_stats: Any = None
        # The threads that compile Triton configs ahead of a descent (created at the first
        # descent that uses them, shut down by disable()).
        self.compile_pool: ThreadPoolExecutor | None = None
        self.compile_pool_threads = 0
        # Facts of the process, kept across disable(): Inductor lowered a graph through
        # the hooks; a job activated from TUNECACHE_DB that compiled but never asked for
        # the database says so once at exit (tunecache.switch).
        self.compiled = False
        # GEMM autotuning went through a lookup patched over tunecache's (GemmHooks.serving)
        self.gemm_stood_aside = False
        self.nothing_shared_atexit = False
        self._database_was_used = False  # by an opener since closed

    @property
    def database_used(self) -> bool:
        """Whether anything asked one of this process's cache openers for the database."""
        return self._database_was_used or (self.opener is not None and self.opener.used)

    def close_opener(self) -> None:
        """Close the process's cache (one given to tunecache.enable() stays open)."""
        with self.lock:
            opener, self.opener = self.opener, None
        if opener is not None:
            self._database_was_used |= opener.used
            opener.close()

    def environment_settings(self) -> Settings:
        """The settings of this process's environment: those the autoload hook read, or
        read now (once) where it did not run. Raises ConfigError for a bad value."""
        with self.lock:
            if self.settings is None:
                from .settings import Settings

                self.settings = Settings.from_env()
                self.say_notices(self.settings)
            return self.settings

    def cache_opener(self, settings: Settings, cache: TuneCache | None = None
                     ) -> CacheOpener:
        """The process's one cache opener, made for ``settings`` (and ``cache``, where the
        caller gave one) if there is none yet."""
        with self.lock:
            if self.opener is None:
                from .opener import RETRY_SECONDS, CacheOpener

                self.opener = CacheOpener(settings, cache, retry_seconds=RETRY_SECONDS)
            return self.opener

    def explain_once(self, level: int, message: str, *args: Any) -> None:
        """Log a line on why something is off, or how to turn it on, once per process."""
        text = message % args if args else message
        with self.lock:
            if text in self.explained:
                return
            self.explained.add(text)
        log.log(level, "%s", text)

    def warn_off(self, off: str, why: BaseException | str, still: str = "") -> None:
        """Warn, once per process, that ``off`` (what tunecache does not do, and Inductor
        or Triton does as usual) because of ``why``, and what ``still`` works."""
        reason = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
        self.explain_once(logging.WARNING, "tunecache: %s (%s)%s", off, reason,
                          f"; {still}" if still else "")

    def say_notices(self, settings: Settings) -> None:
        """The settings' warnings (unknown and renamed variables), each once."""
        for notice in settings.notices:
            self.explain_once(logging.WARNING, "%s", notice)


PROCESS = Process()
