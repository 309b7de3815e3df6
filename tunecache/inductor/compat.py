"""Which torch versions the Inductor hooks support, and the signature checks that refuse
a build whose hooked methods differ (one warning; Inductor then autotunes as usual).

Supported torch versions: 2.11, 2.12, 2.13, 2.14. On any other version :func:`enable`
logs one warning and installs nothing, so Inductor behaves exactly as it would without
tunecache. The hooks were read in the 2.11, 2.13 and 2.14 sources and run on 2.13 (CPU);
:func:`enable` also checks the hooked methods' signatures, so a 2.12 or a patched build
that changed them is refused the same way.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from .state import REGISTRY

__all__ = ["SUPPORTED_TORCH", "LOOKUP_PARAMS", "PRECOMPILE_PARAMS", "torch_version",
           "param_names", "refuse"]

log = logging.getLogger("tunecache")


# (major, minor) bounds, inclusive. See the module docstring for what was checked.
SUPPORTED_TORCH: tuple[tuple[int, int], tuple[int, int]] = ((2, 11), (2, 14))

# The hooked methods' parameter names in every supported version. If a build differs, we
# refuse to hook rather than guess (one warning, Inductor's own behaviour).
LOOKUP_PARAMS = ("choices", "op", "inputs", "benchmark", "hint_override")
PRECOMPILE_PARAMS = ("choices", "name", "inputs_key", "precompilation_timeout_seconds")

def torch_version() -> tuple[int, int] | None:
    import torch

    try:
        major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return None
    return major, minor

def param_names(fn: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def refuse(reason: str) -> bool:
    if not REGISTRY.version_warned:
        REGISTRY.version_warned = True
        log.warning("tunecache: not enabled for Inductor: %s; Inductor autotunes as usual", reason)
    return False
