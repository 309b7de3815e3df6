"""What `tunecache doctor` says of the libraries a job hooks: the torch and Triton
versions, and which parts would come on (their probes: tunecache.parts.Part.probe) or why
one would not.

The probes run in a child process (``python -m tunecache.ops.libraries``), with torch's
entry points off (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``): the doctor itself never imports
torch, and the child must not turn tunecache on as a job would (tunecache._autoload).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Collection
from typing import Any

__all__ = ["report", "probe_parts"]

_TIMEOUT = 300  # importing torch and Inductor on a busy login node


def _version(module: str) -> str | None:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # noqa: BLE001 - absent or broken: that library's parts are off
        return None


def probe_parts(wanted: Collection[str]) -> dict[str, Any]:
    """In this process: the versions, and each part's state (``on`` or why it is off)."""
    from ..switch import PARTS, _load

    torch_version = _version("torch")
    triton_version = _version("triton")
    result: dict[str, Any] = {"torch": torch_version, "triton": triton_version,
                              "untested": None, "parts": []}
    too_old: str | None = None
    if torch_version is not None:
        from ..inductor.compat import too_old as old
        from ..inductor.compat import untested

        too_old, result["untested"] = old(), untested()
    for entry in PARTS:
        why: str | None = None
        needs_torch = not entry.target.startswith("triton.")
        if entry.name not in wanted:
            why = "not asked for (TUNECACHE_SHARE)"
        elif needs_torch and torch_version is None:
            why = "torch is not installed"
        elif triton_version is None and entry.name in ("user_kernels", "triton", "fusion",
                                                       "kernels"):
            why = "Triton is not installed"
        elif needs_torch and too_old is not None:
            why = too_old
        else:
            try:
                importlib.import_module(entry.target)
                probe = _load(entry).probe
                if probe is not None:
                    probe()
            except Exception as e:  # noqa: BLE001 - that is what the job would meet
                why = f"{type(e).__name__}: {e}"
        result["parts"].append({"name": entry.name, "what": entry.what, "on": why is None,
                                "why": why})
    return result


def report(wanted: Collection[str]) -> dict[str, Any]:
    """:func:`probe_parts` in a child process; ``{"error": ...}`` where it failed."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    try:
        done = subprocess.run([sys.executable, "-m", "tunecache.ops.libraries", *wanted],
                              env=env, capture_output=True, text=True, timeout=_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    try:
        data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return data
    except (ValueError, IndexError):
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}


if __name__ == "__main__":
    print(json.dumps(probe_parts(sys.argv[1:])))
