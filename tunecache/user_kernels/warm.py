"""`tunecache warm --user-kernels PACKAGE`: tune here, under this machine's Triton, the
user-kernel keys earlier jobs recorded, so that the next job on this Triton benchmarks
nothing.

Each recorded key whose call was recorded (:mod:`.replay`) is one task (the others are
reported as skipped, so that the operator knows which keys the next job tunes): its
kernel is imported from the installed library, found as the module attribute its name
gives, and called on tensors of the recorded shapes, through Triton's own autotuner with
tunecache in front of it. The call therefore takes the path a job's call takes: the key
is the one a job on this Triton computes (the installed kernel's source and configs, the tuning
values, this Triton), claimed, benchmarked once across the ranks that run warm, and
published. A key already stored for this Triton is a hit: nothing is benchmarked.

Importing a library runs its code, and the database says which kernel to import: only
kernels of the packages the operator names are imported. Everything else read from the
database (the kernel's name, the call) is checked before use.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from .. import stored_json
from ..keys import canonical_json, validate_meta
from ..settings import Settings
from ..store import Database, columns, warm_queries
from ..store.entry_filter import EntryFilter
from .calls import REPLAY, ReplayError, rebuild

__all__ = ["UserKernelTask", "select_user_kernels", "warm_user_kernel", "in_packages",
           "find_autotuner", "device_for_rank", "settings_for_warm"]


@dataclasses.dataclass
class UserKernelTask:
    """One recorded (kernel, tuning values) to tune here, with the call that tuned it."""

    kernel: str
    tuning_key: Any
    call: dict[str, Any]
    seen_in: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def ident(self) -> tuple[str, str]:
        return self.kernel, canonical_json(self.tuning_key)

    def as_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "tuning_key": self.tuning_key, "seen_in": self.seen_in}


def in_packages(kernel: str, packages: Sequence[str]) -> bool:
    """Whether ``kernel`` (``module.qualname``) lies in one of ``packages``."""
    return any(kernel.startswith(p + ".") for p in packages)


def select_user_kernels(db: Database, packages: Sequence[str], *,
                        from_torch: Sequence[str] = (), from_device: Sequence[str] = (),
                        limit: int | None = None,
                        ) -> tuple[list[UserKernelTask], list[dict[str, Any]]]:
    """The distinct recorded keys of the kernels of ``packages`` whose call was recorded,
    and the entries skipped, each with its reason: those warm cannot read, and the keys of
    those packages whose call was not recorded (the next job on this stack tunes them)."""
    env = EntryFilter(only={"torch": list(from_torch), "device": list(from_device)},
                      kinds=["user_kernel"])
    tasks: dict[tuple[str, str], UserKernelTask] = {}
    not_recorded: dict[tuple[str, str], dict[str, Any]] = {}
    skipped: list[dict[str, Any]] = []
    after = ""
    while True:
        page = db.run(functools.partial(warm_queries.user_kernel_page, env=env, after=after,
                                        limit=1000))
        if not page:
            break
        for row in page:
            task, reason = _task_of(row)
            if task is None:
                skipped.append({"key_hash": row.key_hash, "reason": reason})
            elif not in_packages(task.kernel, packages):
                continue
            elif not task.call:
                not_recorded.setdefault(task.ident, {
                    "key_hash": row.key_hash, "kernel": task.kernel,
                    "tuning_key": task.tuning_key, "reason": _NOT_RECORDED})
            else:
                found = tasks.setdefault(task.ident, task)
                found.seen_in.extend(w for w in task.seen_in if w not in found.seen_in)
        after = page[-1].key_hash
    # A key recorded under another stack with its call is re-tuned from that call.
    skipped += [s for ident, s in sorted(not_recorded.items()) if ident not in tasks]
    ordered = sorted(tasks.values(), key=lambda t: t.ident)
    return (ordered[:limit] if limit else ordered), skipped


_NOT_RECORDED = ("the call that tuned it was not recorded (an argument warm cannot rebuild, "
                 "such as a tensor descriptor, or an entry older than recorded calls): the "
                 "next job on this stack tunes it")


def _task_of(row: Any) -> tuple[UserKernelTask | None, str]:
    """The row's task (with an empty call where none was recorded), or None and why."""
    key_json = columns.text(row.key_json)
    if key_json is None:
        return None, f"the recorded key is longer than {warm_queries.WARM_KEY_BYTES} bytes"
    try:
        key = stored_json.loads(key_json, warm_queries.WARM_KEY_BYTES)
    except stored_json.StoredJSONError as e:
        return None, f"the recorded key is not JSON warm reads ({e})"
    kernel = key.get("op") if isinstance(key, dict) else None
    if not isinstance(kernel, str) or not all(p.isidentifier() for p in kernel.split(".")):
        return None, "the recorded key names no kernel"
    if "tuning_key" not in key:
        return None, "the recorded key has no tuning values"
    call = validate_meta(columns.text(row.meta_json)).get(REPLAY)
    env = key.get("env") if isinstance(key.get("env"), dict) else {}
    where = {k: str(env.get(k)) for k in ("device", "torch", "triton")}
    return UserKernelTask(kernel, key["tuning_key"], call if isinstance(call, dict) else {},
                          [where]), ""


def find_autotuner(kernel: str, packages: Sequence[str]) -> Any:
    """The Triton autotuner named ``kernel`` (``module.qualname``), imported from one of
    ``packages``; raises ReplayError where there is none."""
    from triton.runtime.autotuner import Autotuner

    if not in_packages(kernel, packages):
        raise ReplayError(f"{kernel} is in none of the packages named")
    parts = kernel.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        if module_name not in packages and not in_packages(module_name, packages):
            break  # above the packages named: never imported
        try:
            found: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            for name in parts[split:]:
                found = getattr(found, name)
        except AttributeError:
            raise ReplayError(f"{module_name} has no {'.'.join(parts[split:])}") from None
        # The attribute is the outermost decorator's object (heuristics over autotune,
        # or the autotuner itself); the autotuner is the first one inward.
        for _ in range(8):
            if isinstance(found, Autotuner):
                return found
            found = getattr(found, "fn", None)
        raise ReplayError(f"{kernel} is not an @triton.autotune kernel")
    raise ReplayError(f"no module of {kernel} could be imported")


def device_for_rank(local_rank: int) -> Any:
    """The device this rank calls kernels on: the CPU under Triton's interpreter, else
    its GPU."""
    import torch
    from triton import knobs

    if knobs.runtime.interpret:
        return torch.device("cpu")
    return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))


def warm_user_kernel(task: UserKernelTask, packages: Sequence[str],
                     counters: Callable[[], dict[str, int]], device: Any) -> str:
    """Call the task's kernel on ``device``; returns what tunecache did with its key
    ("tuned", "hits", "peer", ...: the counter that moved). Raises what the call
    raised."""
    import torch

    autotuner = find_autotuner(task.kernel, packages)
    call = rebuild(task.call, autotuner.configs, device)
    before = counters()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # Triton launches on the current device
    autotuner.run(*call.args, grid=call.grid, warmup=False, **call.kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    after = counters()
    moved = [name for name in after if after[name] > before.get(name, 0)]
    return ",".join(moved) or "not shared"


def settings_for_warm(settings: Settings) -> Settings:
    """The settings warm tunes under: transfer off (a key tuned for the cluster by the
    operator is tuned in full)."""
    levers = dataclasses.replace(settings.levers, user_kernel_transfer=False,
                                 user_kernel_regret=False)
    return dataclasses.replace(settings, levers=levers,
                               share=settings.share | {"user_kernels"})
