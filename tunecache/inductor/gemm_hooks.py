"""The GEMM part: Inductor's algorithm selector answered from the shared cache (its
``lookup`` and ``make_precompile_fn``, tunecache.inductor.gemm) and the deferred pass that
claims a graph's deferred GEMMs in one go (tunecache.inductor.deferred). Every other
Inductor part relies on it; the switch (tunecache.switch) installs it when
``torch._inductor.select_algorithm`` is imported.

With no cache opener (``tunecache.enable(count_only=True)``) only the benchmark counter is
installed: the hooks count Inductor's benchmarks and answer as Inductor would.
"""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..parts import Part
from ..patching import ABSENT
from ..process import PROCESS
from .compat import (
    LOOKUP_PARAMS,
    PRECOMPILE_PARAMS,
    PRECOMPILE_PARAMS_215,
    InductorChanged,
    param_names,
)
from .deferred import make_pre_fusion_pass
from .gemm import GemmHooks
from .state import REGISTRY

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..opener import CacheOpener
    from ..settings import Settings

__all__ = ["GEMM", "enable_gemm", "disable_gemm"]

log = logging.getLogger("tunecache")


def enable_gemm(ledger: Any, opener: CacheOpener | None, settings: Settings | None,
                environment: Settings | None) -> bool:
    """Install the selector hooks (and, with a cache, the deferred pass); returns True.
    Raises :class:`InductorChanged` where the selector's methods differ from those the
    hooks were written against."""
    from torch._inductor import select_algorithm

    probe_gemm()
    # The class, not get_algorithm_selector_cache(): creating Inductor's singleton here
    # would run CacheBase.get_system() (and cache triton_key()) the moment
    # select_algorithm is imported, before the job configures anything; without
    # tunecache that happens at the first autotuned op. The hooks go on the class, so a
    # selector Inductor creates later is hooked all the same.
    selector = getattr(select_algorithm, "_ALGORITHM_SELECTOR_CACHE", None)
    cls = type(selector) if selector is not None else select_algorithm.AlgorithmSelectorCache
    hooks = GemmHooks(selector, opener)
    _install_gemm_hooks(hooks, cls)
    if opener is not None:
        _install_pre_fusion_pass(hooks)
    REGISTRY.hooks = hooks
    log.debug("tunecache: Inductor hooks installed (count_only=%s)", opener is None)
    return True


def _installable(fn: Any) -> bool:
    """Whether ``fn`` is what a hook may go over: Inductor's own method, or a tunecache
    hook an earlier enable left behind (it passes through). Anything else is a patch of
    someone else's, active now, which keeps its place while it lasts."""
    return (str(getattr(fn, "__module__", "")).startswith("torch._inductor.")
            or getattr(fn, "tunecache_hook", False))


def _inductors_own(cls: type, name: str) -> Any:
    """Inductor's own ``name`` as ``cls`` would resolve it without anyone's patch, or
    None where a patch replaced it in the class itself (it cannot be seen then)."""
    for base in cls.__mro__:
        fn = vars(base).get(name)
        if fn is not None and _installable(fn):
            return fn
    return None


def probe_gemm() -> None:
    """Raise :class:`InductorChanged` where the selector's hooked methods differ from
    those the hooks were written against (2.11-2.14, or 2.15's). Inductor's own methods
    are checked, not a patch of someone else's active now (a hook is installed over a
    method only once it is Inductor's own again, and checked then)."""
    from torch._inductor import select_algorithm

    cls = getattr(select_algorithm, "AlgorithmSelectorCache", None)
    if cls is None or not callable(getattr(select_algorithm, "get_algorithm_selector_cache",
                                           None)):
        raise InductorChanged("this torch lacks select_algorithm.AlgorithmSelectorCache")
    for name in ("lookup", "make_precompile_fn"):
        fn = _inductors_own(cls, name)
        if fn is not None and not _signature_known(name, fn):
            raise InductorChanged(
                "AlgorithmSelectorCache.lookup/make_precompile_fn changed signature")


def _signature_known(name: str, fn: Any) -> bool:
    allowed = ((LOOKUP_PARAMS,) if name == "lookup"
               else (PRECOMPILE_PARAMS, PRECOMPILE_PARAMS_215))
    return getattr(fn, "tunecache_hook", False) or param_names(fn) in allowed


def disable_gemm() -> bool:
    """Drop the hooks (the ledger undoes their patches); returns whether they were on."""
    hooks, REGISTRY.hooks = REGISTRY.hooks, None
    return hooks is not None


GEMM = Part(enable_gemm, disable_gemm, "not enabled for Inductor",
            "Inductor autotunes as usual", probe=probe_gemm)


def _inherited(cls: type, name: str) -> Any:
    """What ``cls.name`` resolves to below ``cls`` itself (its bases, in MRO order)."""
    for base in cls.__mro__[1:]:
        if name in vars(base):
            return vars(base)[name]
    raise AttributeError(name)


def _install_gemm_hooks(hooks: GemmHooks, cls: Any) -> None:
    """The selector class's lookup and make_precompile_fn through ``hooks`` (count-only
    hooks too), through the process's patch ledger.

    On the class, not the instance, so that they compose: a later patch of either method
    on the class (``patch.object(AlgorithmSelectorCache, "lookup", ...)``, as PyTorch's
    own tests, profilers and users' selection overrides do) replaces ours for its
    duration, and ours is back when it ends. A patch of a base class's method (lookup is
    PersistentCache's) or of the instance is theirs as well: each hook calls the method
    it hides as it is now, and only serves while that is the one captured when it was
    installed (:meth:`GemmHooks.serving`).

    A patch of someone else's already active now keeps its place: that method's hook is
    installed once Inductor's own is back (the patch ended, and took whatever was over it
    along), checked by every call of either hook and by ``serving()``."""
    from torch._inductor import select_algorithm

    installed: dict[str, Any] = {}
    captured: dict[str, Any] = {}  # what each hook hid when installed
    own: dict[str, Any] = {}  # the class's own value then (the ledger's record)
    waiting: set[str] = set()
    # make_precompile_fn takes 2.15's benchmark_inputs_key, the string lookup() then gets
    # as ``inputs``: read from the method the hook went over.
    benchmark_key: list[bool] = [False]
    arming = threading.Lock()

    def arm(name: str) -> None:
        fn = getattr(cls, name)
        if not _installable(fn) or not _signature_known(name, fn):
            waiting.add(name)
            return
        if name == "make_precompile_fn":  # (a hook left behind takes it too)
            benchmark_key[0] = (getattr(fn, "tunecache_hook", False)
                                or param_names(fn) == PRECOMPILE_PARAMS_215)
        captured[name] = fn
        own[name] = PROCESS.ledger.patch(cls, name, installed[name])
        waiting.discard(name)

    def rearm() -> None:
        """Install each hook still waiting whose method is Inductor's own again."""
        if not waiting or REGISTRY.hooks is not hooks:
            return
        with arming:
            for name in sorted(waiting):
                arm(name)
        if not waiting:
            log.debug("tunecache: GEMM hooks installed now that the patch over them ended")

    def below(name: str) -> Any:
        """The function our ``name`` hides, as it is now."""
        was = own[name]
        return _inherited(cls, name) if was is ABSENT else was

    def serving() -> bool:
        """Whether tunecache's lookup is the one Inductor calls now."""
        rearm()
        current = select_algorithm._ALGORITHM_SELECTOR_CACHE
        return (REGISTRY.hooks is hooks and "lookup" not in waiting
                and vars(cls).get("lookup") is installed["lookup"]
                and below("lookup") is captured["lookup"]
                and (current is None or "lookup" not in vars(current)))

    def lookup(
        self: Any,
        choices: list[Any],
        op: str,
        inputs: str,
        benchmark: Callable[[Any], dict[Any, float]] | None,
        hint_override: int | None = None,
    ) -> dict[Any, float]:
        rearm()
        inner = below("lookup")
        if inner is not captured["lookup"] or REGISTRY.hooks is not hooks:
            # A base class's lookup patched since (theirs wins), or a hook left behind
            # by a disable() made while someone's patch hid it: pass through.
            return inner(self, choices, op, inputs, benchmark, hint_override)
        return hooks.lookup(types.MethodType(inner, self), choices, op, inputs, benchmark,
                            hint_override)

    def make_precompile_fn(
        self: Any,
        choices: list[Any],
        name: str,
        inputs_key: str,
        benchmark_inputs_key: str | None = None,
        precompilation_timeout_seconds: int | None = 60 * 60,
    ) -> Callable[[], dict[Any, float]]:
        if REGISTRY.hooks is hooks:
            if not serving():  # (which installs a waiting lookup hook first)
                PROCESS.gemm_stood_aside = True  # said at exit if the store went unused
            try:
                # Recorded under the string lookup() will get, to match the two.
                hooks.note_choices(choices, name, benchmark_inputs_key or inputs_key)
            except Exception as e:  # noqa: BLE001 - only the deferred pass loses this op
                hooks.warn_once("recording a deferred GEMM", e)
        inner = below("make_precompile_fn")
        if not benchmark_key[0]:
            return inner(
                self, choices, name, inputs_key,
                precompilation_timeout_seconds=precompilation_timeout_seconds)
        return inner(
            self,
            choices,
            name,
            inputs_key,
            benchmark_inputs_key=benchmark_inputs_key,
            precompilation_timeout_seconds=precompilation_timeout_seconds,
        )

    hooked: tuple[tuple[str, Any], ...] = (("lookup", lookup),
                                           ("make_precompile_fn", make_precompile_fn))
    for name, fn in hooked:
        fn.__qualname__ = f"{cls.__qualname__}.{name}"
        fn.tunecache_hook = True  # how a reader (and the tests) tell ours
        installed[name] = fn
        arm(name)
    if waiting:
        log.debug("tunecache: %s patched by someone else now; tunecache's hook waits for "
                  "Inductor's own to be back", ", ".join(sorted(waiting)))
    hooks.serving = serving  # type: ignore[method-assign]


def _install_pre_fusion_pass(hooks: GemmHooks) -> None:
    """The deferred pass (a graph's deferred GEMMs in one go), in place of Inductor's own
    distributed GEMM autotuning, through REGISTRY.patches."""
    from torch._inductor import config

    patch = PROCESS.ledger.patch
    if getattr(config, "distributed_max_autotune_gemm", False):
        patch(config, "distributed_max_autotune_gemm", False)
        log.info(
            "tunecache: turned off torch._inductor.config.distributed_max_autotune_gemm; "
            "tunecache shares GEMM autotuning across ranks and jobs instead"
        )
    patch(config, "_pre_fusion_custom_pass",
          make_pre_fusion_pass(hooks, config._pre_fusion_custom_pass))
