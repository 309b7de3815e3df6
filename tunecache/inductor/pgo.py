"""Dynamo's shape profiles shared through the database: tunecache as Dynamo's remote PGO
cache (profile-guided automatic dynamic shapes), loading only profiles whose signature
verifies. On wherever a key is configured, as graphs are; ``TUNECACHE_SHARE=-profiles`` turns it
off.

How Dynamo reaches its remote PGO cache (``torch/_dynamo/pgo.py``, read in torch 2.13;
the same calls in the upstream source of the 2.11 era, see below):

* A job that sees an input's size change marks that dimension dynamic in its "code
  state" (per compiled frame: each input's sizes, strides and scalars, or "dynamic") and
  writes the state after every compile that changed it (``put_code_state``); the next
  job reads it before its first compile (``get_code_state``) and compiles those
  dimensions dynamic at first sight instead of static first, then again dynamic.
* The state is keyed by ``get_cache_key()``: ``torch.compiler.config.job_id``
  (``TORCH_COMPILE_JOB_ID``), the global rank (None outside a process group) and
  ``torch.compiler.config.cache_key_tag``, as ``"{job_id}:{rank}:{tag}"``. Without a job
  id there is no key, and Dynamo neither reads nor writes a profile, local or remote.
  ``torch.compiler.config.force_disable_caches`` turns it all off.
* It looks in its local file first (``<TORCHINDUCTOR_CACHE_DIR>/dynamo/code_state_KEY
  .pkl``, with ``automatic_dynamic_local_pgo``, on by default), then in the remote cache
  when ``torch._dynamo.config.automatic_dynamic_remote_pgo`` is true (None, the default,
  means off outside fbcode). ``get_remote_cache()`` calls ``remote_cache.create_cache(
  "dynamo-pgo", is_fbcode, "FbRemoteDynamoPGOCache", "RemoteDynamoPGOCache")``, which
  looks the class up **by name** in ``torch._inductor.remote_cache``, anew on every read
  and write (nothing memoized): replacing that name, as for the graph caches
  (inductor.graphs), is the override point.
* It puts ``{"data": base64 of pickle.dumps(code state)}`` and, on a hit, base64-decodes
  ``data`` and **unpickles** it. It rewrites the same key as it learns (last writer
  wins), so the share is rewritable, unlike compiled graphs.

torch 2.11: the upstream pgo.py of that era reads the remote cache through the same
``get_remote_cache``/``create_cache`` name and value format, and gets its key the same
way (``format_cache_key``: job id, rank, tag; ``force_disable_caches`` read from
``torch.compiler.config``). What differs is inside the pickle: its ``CodeId`` (a
function's identity in the profile) has no ``closure_hash``, which 2.13's has and
compares. Earlier releases read ``force_disable_caches`` from Inductor's config;
:func:`_require_internals` checks the names we use, so a build without them leaves this
part off with one warning.

The stored key is Dynamo's key behind the torch version (``torch VERSION/KEY``): a
profile pickles Dynamo's own classes, whose fields change between releases (CodeId
above), so a job only ever unpickles a profile written by its own torch. The bytes are
framed as graphs are (inductor.graphs.encode_entry), and tunecache.core.pgo signs, bounds
and verifies them before anything reaches Dynamo's unpickler.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from ..core.pgo import ProfileShare
from ..errors import SigningKeyError
from ..parts import Part
from .compat import explain_once, kept_off, require, turn_on
from .graphs import decode_entry, encode_entry
from .state import REGISTRY

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..opener import CacheOpener
    from ..patching import Ledger
    from ..settings import Settings

__all__ = ["PGO", "KIND", "CLASS_NAME", "stored_key", "enable_pgo", "disable_pgo"]

log = logging.getLogger("tunecache")

KIND = "pgo"
CLASS_NAME = "RemoteDynamoPGOCache"  # Dynamo's name in torch._inductor.remote_cache

_HOW_TO = (
    "tunecache: Dynamo's shape profiles are not shared through the database "
    "(no key configured); run `tunecache keygen DIR` once, then set "
    "TUNECACHE_SIGNING_KEY=DIR/tunecache-signing.key on jobs that publish, or "
    "TUNECACHE_VERIFY_KEY=DIR/tunecache-verify.pub on jobs that only load"
)
_NO_JOB_ID = (
    "tunecache: Dynamo keys its shape profiles by job id, and this job has none: set "
    "TORCH_COMPILE_JOB_ID (one value for every job of a model) to share them"
)


def stored_key(dynamo_key: str) -> str:
    """The database key of the profile Dynamo keys ``dynamo_key``, for this torch."""
    import torch

    return f"torch {torch.__version__}/{dynamo_key}"


@functools.cache
def remote_pgo_class() -> type:
    """Our stand-in for Dynamo's remote PGO cache (one class: the patch ledger's "still
    ours" check compares the object)."""
    from torch._inductor import remote_cache as rc

    from .graphs import _torch_version

    class TuneCachePGOBackend(rc.RemoteCacheBackend):
        """get/put of Dynamo's profiles through REGISTRY.pgo."""

        def _get(self, key: str) -> Any:
            share = REGISTRY.pgo
            if share is None:
                return None
            data = share.load(KIND, stored_key(key))
            if data is None:
                return None
            value = decode_entry(data)
            if value is None:
                log.debug("tunecache: shape profile %s has an unknown format", key)
            return value

        def _put(self, key: str, data: Any) -> None:
            share = REGISTRY.pgo
            if share is None or not share.publishes:
                return
            frame = encode_entry(data)
            if frame is None:
                log.debug("tunecache: not publishing a shape profile of unexpected shape")
                return
            share.publish(KIND, stored_key(key), frame, _torch_version())

    def __init__(self: Any, cache_id: str) -> None:
        rc.RemoteCache.__init__(self, TuneCachePGOBackend(), rc.RemoteCachePassthroughSerde())

    # Dynamo reports cache use (TORCH_LOGS=cache) under the class's name.
    return type("TuneCacheDynamoPGOCache", (rc.RemoteCache,), {
        "__init__": __init__, "__module__": __name__,
        "__doc__": "Dynamo's remote PGO cache, backed by tunecache's database."})


def _require_internals() -> None:
    """Raise :class:`InductorChanged` where this torch lacks what profile sharing uses."""
    from torch._dynamo import config as dynamo_config
    from torch._dynamo import pgo
    from torch._inductor import remote_cache as rc

    require(
        ("remote_cache.RemoteCache", hasattr(rc, "RemoteCache")),
        ("remote_cache.RemoteCacheBackend", hasattr(rc, "RemoteCacheBackend")),
        ("remote_cache.RemoteCachePassthroughSerde", hasattr(rc, "RemoteCachePassthroughSerde")),
        (f"remote_cache.{CLASS_NAME}", hasattr(rc, CLASS_NAME)),
        ("dynamo pgo.get_remote_cache", callable(getattr(pgo, "get_remote_cache", None))),
        ("dynamo config.automatic_dynamic_remote_pgo",
         hasattr(dynamo_config, "automatic_dynamic_remote_pgo")),
    )


def enable_pgo(ledger: Ledger, cache: CacheOpener, settings: Settings,
               environment: Settings | None) -> bool:
    """Serve Dynamo's remote PGO cache from the database, if ``settings`` turn profiles
    on and configure a key; returns whether profiles are shared. Every change goes
    through ``ledger``."""
    plan = settings.pgo_sharing()
    if plan.state == "off":
        return False
    # Profiles use the graphs' keys: the graphs' info line says how to configure one
    # (unless graphs are off), and a bad key setting, or a key file that does not load, is
    # the graphs' one warning (graphs warn about keys even when off). Only a problem of
    # profiles' own warns here.
    graphs = settings.graph_sharing()
    if plan.state == "unconfigured":
        if graphs.state == "off":
            explain_once(logging.INFO, "%s", _HOW_TO)
        return False
    if plan.state == "invalid":
        own = plan.problem != graphs.problem
        explain_once(logging.WARNING if own else logging.INFO,
                     "tunecache: Dynamo's shape profiles are not shared: %s", plan.problem)
        return False
    try:
        share = ProfileShare.from_settings(plan, cache)
    except SigningKeyError as e:
        explain_once(logging.WARNING if graphs.state == "off" else logging.INFO,
                     "tunecache: Dynamo's shape profiles are not shared: %s", e)
        return False
    _require_internals()
    import torch
    from torch._dynamo import config as dynamo_config
    from torch._inductor import remote_cache as rc

    if kept_off(dynamo_config, "automatic_dynamic_remote_pgo"):
        return False  # TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO=0
    REGISTRY.pgo = share
    ledger.patch(rc, CLASS_NAME, remote_pgo_class())
    turn_on(ledger, dynamo_config, "automatic_dynamic_remote_pgo")
    if getattr(torch.compiler.config, "job_id", None) is None:
        # Read again at every compile: a job may still set it in code.
        explain_once(logging.INFO, "%s", _NO_JOB_ID)
    log.debug("tunecache: shape profiles shared (%s, key %s)",
              "publish and load" if share.publishes else "load only", share.fingerprint)
    return True


def disable_pgo() -> bool:
    """Stop serving profiles; returns whether they were served (the ledger undoes the
    patches)."""
    share, REGISTRY.pgo = REGISTRY.pgo, None
    return share is not None


PGO = Part(enable_pgo, disable_pgo, "Dynamo's shape profiles are not shared",
           "tuning is shared as usual", probe=_require_internals)
