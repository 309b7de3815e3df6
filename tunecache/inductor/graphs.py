"""Compiled graphs shared through the database: tunecache as Inductor's remote FX graph
cache and remote AOTAutograd cache, loading only entries whose signature verifies.

How Inductor reaches a remote graph cache (read in torch 2.13 and 2.14, and in earlier
releases' autograd_cache.py; the same in each):

* ``FxGraphCache.get_remote_cache()`` and ``AOTAutogradCache.get_remote_cache()`` call
  ``remote_cache.create_cache(cache_id, is_fbcode, "Fb…", "RemoteFxGraphCache" /
  "RemoteAOTAutogradCache")``, which looks the class up **by name** in
  ``torch._inductor.remote_cache`` (open-source builds: a Redis client). Replacing those
  two names is the one override point both caches share, as tunecache already does for
  ``RemoteAutotuneCache`` (triton/remote.py). ``AOTAutogradCache.get_remote_cache`` is
  ``functools.cache``d: its cache is cleared when we install and remove ours (the
  classes, the FX graph flag and the answer below are set through the registry's patch
  ledger, and :func:`tunecache.inductor.disable` undoes them).
* They are used when ``torch._inductor.config.fx_graph_remote_cache`` is true and
  ``should_use_remote_autograd_cache()`` answers True (None, the default of both flags,
  means off outside fbcode). tunecache turns the first on where it is None; it is left
  out of the FX graph's cache key. The second flag, ``torch._functorch.config.
  enable_remote_autograd_cache``, stays as the user left it: it is part of the
  AOTAutograd key (functorch's ``config.save_config()``), and a True of ours could not
  be told from a True the user sets later. While it is None, tunecache answers
  ``should_use_remote_autograd_cache()`` itself (``_answer_remote_autograd``); every job
  that shares graphs has it None, so their keys agree.
* Inductor puts ``{"data": base64 of the pickled entry, "time_taken_ms": n}`` and, on
  a hit, base64-decodes ``data`` and **unpickles** it. The local caches stay first in
  line: a local hit never asks the remote one, and a remote hit is also written locally.
* Triton kernels travel inside FX graph entries where
  ``config.bundle_triton_into_fx_graph_cache`` is on (the open-source default), so a
  graph loaded from the database runs without compiling a kernel.

The stored bytes are ``TCG1`` + the entry's JSON fields but ``data`` + a newline + the
pickle itself (not its base64): tunecache.core.graphs compresses, signs and verifies them
and hands them back only when the signature holds, so nothing reaches Inductor's unpickler
unverified.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
from typing import TYPE_CHECKING, Any

from .. import stored_json
from ..core.graphs import GraphShare
from ..errors import SigningKeyError
from ..parts import Part
from .compat import explain_once, kept_off, require, turn_on
from .state import REGISTRY

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..opener import CacheOpener
    from ..patching import Ledger
    from ..settings import Settings

__all__ = ["GRAPHS", "enable_graphs", "disable_graphs", "clear_autograd_remote_cache",
           "encode_entry", "decode_entry", "KIND_OF_CLASS"]

log = logging.getLogger("tunecache")

# Inductor's class name in torch._inductor.remote_cache -> our artifact kind.
KIND_OF_CLASS = {"RemoteFxGraphCache": "fxgraph", "RemoteAOTAutogradCache": "autograd"}
_MAGIC = b"TCG1"
# The fields of Inductor's remote-cache value besides its data (a time, a version): tiny.
MAX_FIELDS = 64 * 1024

_HOW_TO = (
    "tunecache: compiled graphs are not shared through the database (no key configured); "
    "to share them, run `tunecache keygen DIR` once, then set "
    "TUNECACHE_SIGNING_KEY=DIR/tunecache-signing.key on jobs that publish graphs, or "
    "TUNECACHE_VERIFY_KEY=DIR/tunecache-verify.pub on jobs that only load them "
    "(TUNECACHE_SHARE=-graphs silences this line)"
)


def encode_entry(value: Any) -> bytes | None:
    """The bytes stored for Inductor's remote-cache value, or None for a value of a shape
    this tunecache does not know (then nothing is published)."""
    if not isinstance(value, dict) or not isinstance(value.get("data"), (str, bytes)):
        return None
    try:
        raw = base64.b64decode(value["data"], validate=True)
        fields = stored_json.check(json.dumps({k: v for k, v in value.items() if k != "data"},
                                              sort_keys=True, allow_nan=False), MAX_FIELDS)
    except (binascii.Error, TypeError, ValueError):
        return None
    return _MAGIC + fields.encode() + b"\n" + raw  # json.dumps never writes a raw newline


def decode_entry(data: bytes) -> dict[str, Any] | None:
    """Inductor's remote-cache value from verified bytes, or None if malformed."""
    if not data.startswith(_MAGIC):
        return None
    fields, sep, raw = data[len(_MAGIC):].partition(b"\n")
    try:
        value = stored_json.loads(fields, MAX_FIELDS) if sep else None
    except stored_json.StoredJSONError:
        return None
    if not isinstance(value, dict):
        return None
    value["data"] = base64.b64encode(raw).decode("ascii")
    return value


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _autograd_entries_served() -> bool:
    """Whether AOTAutograd entries are served now: while the FX graph remote cache and the
    local AOTAutograd cache are on."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config

    return bool(config.fx_graph_remote_cache) and bool(functorch_config.enable_autograd_cache)


@functools.cache
def remote_cache_classes() -> dict[str, type]:
    """Our stand-ins for Inductor's remote graph caches, by Inductor's class name."""
    from torch._inductor import remote_cache as rc

    class TuneCacheGraphBackend(rc.RemoteCacheBackend):
        """get/put of one kind of compiled graph through REGISTRY.graphs."""

        def __init__(self, kind: str) -> None:
            super().__init__()
            self.kind = kind

        def serves(self) -> bool:
            """Whether this kind is served now. An AOTAutograd entry is only while the FX
            graph remote cache and the local AOTAutograd cache are on (a test or a user
            may turn either off after tunecache is on): its hit without its FX graph costs
            a miss, a second compile and an artifact recorded twice, and a cache turned
            off must not live on remote-only."""
            return self.kind != "autograd" or _autograd_entries_served()

        def _get(self, key: str) -> Any:
            share = REGISTRY.graphs
            if share is None or not self.serves():
                return None
            data = share.load(self.kind, key)
            if data is None:
                return None
            value = decode_entry(data)
            if value is None:
                # Signed by our key pair, yet not our format: a newer tunecache's.
                log.debug("tunecache: compiled graph %s %s has an unknown format", self.kind, key)
            return value

        def _put(self, key: str, data: Any) -> None:
            share = REGISTRY.graphs
            if share is None or not self.serves():
                return
            share.compiled_here(self.kind, key)
            if not share.publishes:
                return
            frame = encode_entry(data)
            if frame is None:
                log.debug("tunecache: not publishing a %s entry of unexpected shape", self.kind)
                return
            share.publish(self.kind, key, frame, _torch_version())

    def cache_class(name: str, kind: str) -> type:
        def __init__(self: Any, cache_id: str) -> None:
            rc.RemoteCache.__init__(self, TuneCacheGraphBackend(kind),
                                    rc.RemoteCachePassthroughSerde())

        def get_backend(self: Any) -> Any:
            """The backend a ``backend_override_cls`` set on the class now gives (one per
            override), else the one this instance was made with. torch keeps one
            AOTAutograd remote cache per process (``get_remote_cache`` is cached), so an
            override patched after it was made (``mock_cache.PatchCaches``, as PyTorch's
            tests do) must still win for its duration, as for an instance made under it."""
            override = getattr(type(self), "backend_override_cls", None)
            if override is None:
                return self.__dict__["_backend"]
            made = self.__dict__.get("_override")
            if made is None or made[0] is not override:
                made = self.__dict__["_override"] = (override, override())
            return made[1]

        def set_backend(self: Any, backend: Any) -> None:
            self.__dict__["_backend"] = backend

        # Inductor reports cache use (TORCH_LOGS=cache) under the class's name.
        return type(name, (rc.RemoteCache,), {
            "__init__": __init__, "__module__": __name__,
            "backend": property(get_backend, set_backend),
            "__doc__": f"Inductor's {kind} remote cache, backed by tunecache's database."})

    return {
        "RemoteFxGraphCache": cache_class("TuneCacheFxGraphCache", "fxgraph"),
        "RemoteAOTAutogradCache": cache_class("TuneCacheAOTAutogradCache", "autograd"),
    }


def _require_internals() -> None:
    """Raise :class:`InductorChanged` where this torch lacks an Inductor internal graph
    sharing needs."""
    from torch._functorch import config as functorch_config
    from torch._functorch._aot_autograd import autograd_cache
    from torch._inductor import codecache, config
    from torch._inductor import remote_cache as rc

    require(
        ("remote_cache.RemoteCache", hasattr(rc, "RemoteCache")),
        ("remote_cache.RemoteCacheBackend", hasattr(rc, "RemoteCacheBackend")),
        ("remote_cache.RemoteCachePassthroughSerde", hasattr(rc, "RemoteCachePassthroughSerde")),
        ("remote_cache.RemoteFxGraphCache", hasattr(rc, "RemoteFxGraphCache")),
        ("remote_cache.RemoteAOTAutogradCache", hasattr(rc, "RemoteAOTAutogradCache")),
        ("remote_cache.create_cache", callable(getattr(rc, "create_cache", None))),
        ("FxGraphCache.get_remote_cache",
         callable(getattr(getattr(codecache, "FxGraphCache", None), "get_remote_cache", None))),
        ("AOTAutogradCache.get_remote_cache",
         callable(getattr(getattr(autograd_cache, "AOTAutogradCache", None),
                          "get_remote_cache", None))),
        ("config.fx_graph_remote_cache", hasattr(config, "fx_graph_remote_cache")),
        ("functorch config.enable_remote_autograd_cache",
         hasattr(functorch_config, "enable_remote_autograd_cache")),
    )


def clear_autograd_remote_cache() -> None:
    # AOTAutogradCache.get_remote_cache is functools.cache'd (2.13, 2.14): an instance
    # made before the switch would outlive it.
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

    clear = getattr(AOTAutogradCache.get_remote_cache, "cache_clear", None)
    if callable(clear):
        clear()


# Where torch asks whether the remote AOTAutograd cache is on: the function and the two
# modules that import it by name (2.13-2.15).
_REMOTE_AUTOGRAD_USERS = ("torch._functorch._aot_autograd.autograd_cache",
                          "torch._functorch.aot_autograd",
                          "torch._functorch._aot_autograd.graph_compile")


def _answer_remote_autograd(ledger: Ledger) -> None:
    """torch's ``should_use_remote_autograd_cache()`` answered by tunecache while the
    user leaves ``enable_remote_autograd_cache`` None: on while tunecache serves graphs
    and the FX graph remote cache and the local AOTAutograd cache are on (``serves``). A
    job that turned the AOTAutograd cache off must not go through AOTAutogradCache on
    tunecache's account: it records the entries it saves for
    ``torch.compiler.save_cache_artifacts()`` (test_codecache.py's
    test_cache_hot_load_pgo). The user's True or False, set before tunecache is on or
    after, is torch's answer unchanged (test_log_event_autograd_remote: a remote-only
    AOTAutograd cache)."""
    import importlib

    import torch
    from torch._functorch import config as functorch_config

    modules = []
    for name in _REMOTE_AUTOGRAD_USERS:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(module, "should_use_remote_autograd_cache", None)):
            modules.append(module)
    if not modules:
        return
    inner = modules[0].should_use_remote_autograd_cache

    @functools.wraps(inner)
    def should_use_remote_autograd_cache() -> bool:
        if REGISTRY.graphs is None or functorch_config.enable_remote_autograd_cache is not None:
            return bool(inner())
        if getattr(torch.compiler.config, "force_disable_caches", False):
            return False
        return _autograd_entries_served()

    for module in modules:
        ledger.patch(module, "should_use_remote_autograd_cache",
                     should_use_remote_autograd_cache)


def enable_graphs(ledger: Ledger, cache: CacheOpener, settings: Settings,
                  environment: Settings | None) -> bool:
    """Serve Inductor's remote FX graph and AOTAutograd caches from the database, if
    ``settings`` configure a key; otherwise say once how to (or why not) and change
    nothing. Returns whether graphs are shared. Every change goes through ``ledger``."""
    plan = settings.graph_sharing()
    if plan.state == "off":
        return False
    if plan.state == "unconfigured":
        explain_once(logging.INFO, "%s", _HOW_TO)
        return False
    if plan.state == "invalid":
        explain_once(logging.WARNING, "tunecache: compiled graphs are not shared: %s; "
                     "tuning is shared as usual", plan.problem)
        return False
    try:
        share = GraphShare.from_settings(plan, cache)
    except SigningKeyError as e:
        explain_once(logging.WARNING, "tunecache: compiled graphs are not shared: %s; "
                     "tuning is shared as usual", e)
        return False
    _require_internals()
    from torch._functorch import config as functorch_config
    from torch._inductor import config
    from torch._inductor import remote_cache as rc

    # The user's False of either flag is kept (TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=0,
    # TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=0); AOTAutograd entries need the FX graph's.
    if kept_off(config, "fx_graph_remote_cache"):
        return False
    REGISTRY.graphs = share
    for name, cls in remote_cache_classes().items():
        ledger.patch(rc, name, cls)
    turn_on(ledger, config, "fx_graph_remote_cache")
    kept_off(functorch_config, "enable_remote_autograd_cache")  # (said once if so)
    _answer_remote_autograd(ledger)
    clear_autograd_remote_cache()
    log.debug("tunecache: compiled graphs shared (%s, key %s)",
              "publish and load" if share.publishes else "load only", share.fingerprint)
    return True


def disable_graphs() -> bool:
    """Stop serving compiled graphs; returns whether they were served. What
    enable_graphs patched is the ledger's to undo (:func:`tunecache.inductor.disable`),
    and then :func:`clear_autograd_remote_cache`."""
    share, REGISTRY.graphs = REGISTRY.graphs, None
    return share is not None


GRAPHS = Part(enable_graphs, disable_graphs, "compiled graphs are not shared",
              "tuning is shared as usual", after_undo=clear_autograd_remote_cache,
              probe=_require_internals)
