"""The key of one tuning of a user's ``@triton.autotune`` kernel, and its candidates' ids.

A key holds everything that decides which config wins, so that no change to any of it
ever reads an old winner:

- ``op``: the kernel, named ``module.qualname`` of its Python function (what ``tunecache
  ls`` and ``stats`` show);
- ``source``: Triton's hash of the kernel's source and of every function and global
  constexpr it uses (``JITFunction.cache_key``), so a library upgrade that edits the
  kernel, or a helper it calls, tunes it again; under Triton's interpreter, which has no
  such hash, a hash of the function's own source;
- ``tuning_key``: the values Triton keys the tuning on (the autotune key's arguments, then
  the dtype of every tensor argument), in Triton's order;
- ``configs``: the ids of the configs benchmarked (after ``prune_configs_by``), in order,
  and, where configs carry a ``pre_hook``, each hook's name and a hash of its source;
- ``env``: the device's name, torch's and Triton's versions, Triton's own hash of its
  installation, the compile target and its backend's hash, and the environment variables
  Triton says change a compile.

A config's id is the canonical JSON of everything Triton launches it with
(``Config.all_kwargs()``) and the name of its ``pre_hook``: a stored winner is only ever
matched to one of the kernel's own live configs, hook included, so the hook runs as it
does after Triton's own tuning (Triton's file cache cannot hold hooks and skips such
kernels; Liger-Kernel's TMA matmuls are among them).

The family (the key without the tuning values) is what a later transfer between key
values would look neighbours up by.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import sys
from collections.abc import Sequence
from typing import Any

from ..keys import Key, canonical_json

__all__ = ["KIND", "VERSION_FIELDS", "config_id", "distinct_ids", "tuning_values", "kernel_name",
           "user_kernel_key"]

KIND = "user_kernel"
# The fields of a key's ``env`` that an upgrade of torch or Triton changes; the device,
# the compile target and the variables that change a compile stay.
VERSION_FIELDS = ("torch", "triton", "triton_key", "backend")


def config_id(config: Any) -> str:
    """The id of a ``triton.Config``: what it launches the kernel with, and the name of
    the hook it runs first (``pre_hook``), as canonical JSON."""
    launch = dict(config.all_kwargs())
    if config.pre_hook is not None:
        launch["pre_hook"] = _qualified_name(config.pre_hook)
    return json.dumps(launch, sort_keys=True, separators=(",", ":"), default=str)


def distinct_ids(configs: Sequence[Any]) -> bool:
    """Whether every config has an id of its own, so a stored winner names one of them."""
    ids = [config_id(c) for c in configs]
    return len(set(ids)) == len(ids)


def _qualified_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _hook_sources(configs: Sequence[Any]) -> list[list[str]]:
    """Each config hook's name and a hash of its source: a hook edited by an upgrade (a
    TMA descriptor set up another way) is a changed kernel too."""
    hooks = {_qualified_name(c.pre_hook): c.pre_hook for c in configs if c.pre_hook is not None}
    found = []
    for name, hook in sorted(hooks.items()):
        try:
            source = inspect.getsource(hook)
        except (OSError, TypeError):  # no source to read (a builtin, a C extension)
            source = repr(hook)
        found.append([name, hashlib.sha256(source.encode()).hexdigest()])
    return found


def tuning_values(tuning_key: Sequence[Any]) -> list[Any]:
    """Triton's tuning key as JSON values: numbers, text and booleans as they are (the
    types kept, so 1, 1.0, True and "1" stay apart), anything else (a dtype) as its text."""
    return [v if isinstance(v, (bool, int, str)) or (isinstance(v, float) and v == v)
            else f"{type(v).__name__}:{v}" for v in tuning_key]


def kernel_name(autotuner: Any) -> str:
    fn = autotuner.base_fn
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn.__name__)}"


def _source_hash(autotuner: Any) -> str:
    """Triton's hash of the kernel's source and dependencies; the function's own source
    under the interpreter, whose kernels have none."""
    fn = autotuner.fn
    while not hasattr(fn, "cache_key") and hasattr(fn, "fn"):
        fn = fn.fn
    found = getattr(fn, "cache_key", None)
    if isinstance(found, str):
        return found
    return "source:" + hashlib.sha256(inspect.getsource(autotuner.base_fn).encode()).hexdigest()


@functools.lru_cache(maxsize=8)
def _triton_environment(device: int | None) -> dict[str, Any]:
    """What this process compiles for: computed once per device."""
    import triton
    from triton import knobs
    from triton.runtime import autotuner as triton_autotuner
    from triton.runtime.cache import triton_key

    env: dict[str, Any] = {"triton": triton.__version__, "triton_key": triton_key()}
    torch = _torch()
    env["torch"] = torch.__version__ if torch is not None else None
    if knobs.runtime.interpret:
        env.update(device="cpu", target="interpreter")
    else:
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver

        target = driver.active.get_current_target()
        env["target"] = f"{target.backend}:{target.arch}:{target.warp_size}"
        env["backend"] = make_backend(target).hash()
        env["device"] = driver.active.get_device_interface().get_device_name(device)
    env["compile_env"] = sorted(triton_autotuner.get_cache_invalidating_env_vars().items())
    return env


def _torch() -> Any:
    """torch, where the process imported it (tunecache never imports it for this)."""
    return sys.modules.get("torch")


def _current_device() -> int | None:
    from triton import knobs

    if knobs.runtime.interpret:
        return None
    from triton.runtime.driver import driver

    return int(driver.active.get_current_device())


def user_kernel_key(autotuner: Any, tuning_key: Sequence[Any], configs: Sequence[Any]) -> Key:
    """The key of tuning ``autotuner`` at ``tuning_key`` over ``configs`` (this module's
    docstring)."""
    env = dict(_triton_environment(_current_device()))
    mapping: dict[str, Any] = {
        "kind": KIND,
        "op": kernel_name(autotuner),
        "source": _source_hash(autotuner),
        "configs": [config_id(c) for c in configs],
        "env": env,
    }
    hooks = _hook_sources(configs)
    if hooks:
        mapping["config_hooks"] = hooks
    family = hashlib.sha256(canonical_json(mapping).encode()).hexdigest()
    return Key.of({**mapping, "tuning_key": tuning_values(tuning_key)}, family=family)
