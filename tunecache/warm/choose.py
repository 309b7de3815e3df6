"""Choosing what to warm: the distinct GEMMs recorded in the database (done gemm keys),
and the recorded keys skipped, each with its reason (no torch)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, TypedDict

from .. import stored_json
from ..store import Database, warm_queries
from ..store.entry_filter import EntryFilter
from .inputs import check_inputs, parse_inputs
from .ops import WARM_OPS, not_warmed_reason

__all__ = ["WarmTask", "SkippedKey", "select_tasks", "task_of"]


class SkippedKey(TypedDict):
    """A recorded key warm does not rebuild, and why."""

    key_hash: str
    op: str | None  # None when the key names no op
    reason: str


@dataclasses.dataclass
class WarmTask:
    """One GEMM to compile: (op, inputs, precision, hint_override) and where it was seen."""

    op: str
    inputs: str
    precision: str
    env: dict[str, str]  # the first recorded environment's fingerprint (config flags)
    seen_in: list[dict[str, str | None]] = dataclasses.field(default_factory=list)

    @property
    def ident(self) -> tuple[str, str, str]:
        return (self.op, self.inputs, self.precision)

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "inputs": self.inputs, "precision": self.precision,
                "seen_in": self.seen_in}


# What warm needs each field of a recorded key for, for the reason a key without it is skipped.
_FIELD_USE = {"op": "the operation warm rebuilds",
              "inputs": "the shapes warm needs to rebuild the call"}


def _missing_field_reason(field: str) -> str:
    use = _FIELD_USE.get(field)
    return f'the recorded key has no "{field}"' + (f" ({use})" if use else "")


def task_of(key_hash: str, key_json: Any) -> tuple[WarmTask | None, SkippedKey | None]:
    """The task that compiles a recorded key, or why not (a top-up entry gives neither:
    its base key is warmed anyway)."""
    op = None
    try:
        if key_json is None:
            raise ValueError(f"the recorded key is longer than {warm_queries.WARM_KEY_BYTES} bytes "
                             "(no GEMM's is), or not text")
        key = stored_json.loads(key_json, warm_queries.WARM_KEY_BYTES)
        if not isinstance(key, dict):
            raise ValueError("the recorded key is not a JSON object")
        op = str(key["op"])
        if op not in WARM_OPS:
            raise ValueError(not_warmed_reason(op))
        inputs = key["inputs"]
        check_inputs(op, parse_inputs(inputs))
        if key.get("hint_override") is not None:
            raise ValueError("recorded with a hint override (dynamic shapes)")
        if key.get("extra_candidates"):
            return None, None  # a top-up entry of a base key that is warmed anyway
        task_env = {k: str(v) for k, v in (key.get("env") or {}).items()}
        return WarmTask(op, inputs, str(key.get("precision", "highest")), task_env), None
    except KeyError as e:
        # str(KeyError) is the bare quoted name; say what is missing instead.
        return None, {"key_hash": key_hash, "op": op,
                      "reason": _missing_field_reason(str(e.args[0]))}
    except (ValueError, TypeError) as e:
        return None, {"key_hash": key_hash, "op": op, "reason": str(e)}


def select_tasks(
    db: Database,
    ops: Sequence[str] | None = None,
    *,
    from_torch: Sequence[str] = (),
    from_device: Sequence[str] = (),
    limit: int | None = None,
) -> tuple[list[WarmTask], list[SkippedKey]]:
    """Distinct recorded GEMMs of ``ops`` (done gemm entries), and the keys skipped.

    ``ops`` None: every recorded gemm key; those of ops warm cannot rebuild (not in
    WARM_OPS) come back in the skipped list, each with its reason.
    """
    env = EntryFilter(only={"torch": list(from_torch), "device": list(from_device)},
                      ops=list(ops or ()), kinds=["gemm"])
    tasks: dict[tuple[str, str, str], WarmTask] = {}
    skipped: list[SkippedKey] = []
    after = ""
    while True:
        page = db.run(functools.partial(warm_queries.warm_page, env=env, after=after, limit=1000))
        if not page:
            break
        for row in page:
            task, skip = task_of(row.key_hash, row.key_json)
            if skip is not None:
                skipped.append(skip)
            if task is None:
                continue
            task_env = task.env
            got = tasks.setdefault(task.ident, task)
            where = {"device": task_env.get("device"), "torch": task_env.get("torch"),
                     "triton": task_env.get("triton")}
            if where not in got.seen_in:
                got.seen_in.append(where)
        after = page[-1].key_hash
    ordered = sorted(tasks.values(), key=lambda t: t.ident)
    return (ordered[:limit] if limit else ordered), skipped
