"""`tunecache warm`: re-tune, on this machine, the GEMM keys earlier jobs recorded.

For nightly jobs after a torch or triton upgrade, or on a new GPU type: the recorded keys
say which GEMMs the cluster's models run (op, input sizes/strides/dtypes, precision), so
warm rebuilds those inputs here and compiles a one-op function with
``torch.compile(mode="max-autotune-no-cudagraphs", dynamic=False)`` with tunecache enabled
(tunecache.inductor). Inductor computes this machine's key and tunes it through the shared
cache like any job would; the next job starts warm. (``-no-cudagraphs``: CUDA graphs change
nothing in GEMM autotuning and only cost capture time and memory here.)

Work is split across ranks (torchrun sets RANK/WORLD_SIZE) through the same claims a job
uses: every rank compiles every key, but rank r starts at its own share of the list, so
ranks claim different keys first and later find their peers' keys done (or wait for them).

Inductor only reaches its autotune lookup on a real miss, so each compile runs with a
fresh TORCHINDUCTOR_CACHE_DIR and the FX graph / AOTAutograd caches off (DESIGN.md §3).

torch is imported lazily: importing this module (or tunecache.cli) never imports torch.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from .settings import Settings
from .store import Database
from .store import admin

__all__ = ["WARM_OPS", "WarmTask", "select_tasks", "warm", "parse_inputs"]

logger = logging.getLogger("tunecache")

# Op names as Inductor's tuned_* lowerings pass them to the autotuner (torch 2.11-2.14),
# and the ATen call that lowers to each.
WARM_OPS: dict[str, str] = {"mm": "mm", "addmm": "addmm", "bmm": "bmm", "baddbmm": "baddbmm"}


@dataclasses.dataclass(frozen=True)
class Input:
    device_type: str
    dtype: str
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


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


def parse_inputs(inputs: str) -> list[Input]:
    """Inductor's inputs_key: repr of (device type, dtype, *sizes, *strides, offset) per
    input (AlgorithmSelectorCache.key_of, torch 2.11-2.14)."""
    # The key comes from shared storage: literal_eval runs no code, but deep nesting can
    # exhaust the parser's stack, so bound the text and catch those errors too.
    if len(inputs) > 4096:
        raise ValueError("inputs key is longer than any GEMM's (4096 characters)")
    try:
        raw = ast.literal_eval(inputs)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
        raise ValueError(f"inputs key is not a Python literal: {e}") from None
    if not isinstance(raw, (list, tuple)):
        raise ValueError("inputs key is not a list")
    out = []
    for item in raw:
        if not isinstance(item, (list, tuple)) or len(item) < 3 or (len(item) - 3) % 2:
            raise ValueError(f"unexpected input {item!r}")
        device_type, dtype, *rest = item
        *dims, offset = rest
        n = len(dims) // 2
        if not all(isinstance(d, int) and d >= 0 for d in dims) or not isinstance(offset, int):
            raise ValueError(f"sizes/strides of {item!r} are not whole numbers (symbolic?)")
        out.append(Input(str(device_type), str(dtype), tuple(dims[:n]), tuple(dims[n:]),
                         offset))
    return out


def select_tasks(
    db: Database,
    ops: Sequence[str],
    *,
    from_torch: Sequence[str] = (),
    from_device: Sequence[str] = (),
    limit: int | None = None,
) -> tuple[list[WarmTask], list[dict[str, str]]]:
    """Distinct recorded GEMMs of ``ops`` (done gemm entries), and the keys skipped."""
    env = admin.EntryFilter(only={"torch": list(from_torch), "device": list(from_device)},
                            ops=list(ops), kinds=["gemm"])
    tasks: dict[tuple[str, str, str], WarmTask] = {}
    skipped: list[dict[str, str]] = []
    after = ""
    while True:
        page = db.run(lambda c: c.execute(admin.select_done_page(env, after, 1000)).all())
        if not page:
            break
        for row in page:
            try:
                key = json.loads(row.key_json)
                inputs = key["inputs"]
                parse_inputs(inputs)
                if key.get("hint_override") is not None:
                    raise ValueError("recorded with a hint override (dynamic shapes)")
                if key.get("extra_candidates"):
                    continue  # a top-up entry of a base key that is warmed anyway
                task_env = {k: str(v) for k, v in (key.get("env") or {}).items()}
                task = WarmTask(str(key["op"]), inputs, str(key.get("precision", "highest")),
                                task_env)
            except (ValueError, KeyError, TypeError) as e:
                skipped.append({"key_hash": row.key_hash, "reason": str(e)})
                continue
            got = tasks.setdefault(task.ident, task)
            where = {"device": task_env.get("device"), "torch": task_env.get("torch"),
                     "triton": task_env.get("triton")}
            if where not in got.seen_in:
                got.seen_in.append(where)
        after = page[-1].key_hash
    ordered = sorted(tasks.values(), key=lambda t: t.ident)
    return (ordered[:limit] if limit else ordered), skipped


def _rank() -> tuple[int, int, int]:
    def env_int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return env_int("RANK", 0), max(1, env_int("WORLD_SIZE", 1)), env_int("LOCAL_RANK", 0)


def _my_order(tasks: Sequence[WarmTask], rank: int, world: int) -> list[WarmTask]:
    """Rank r starts at its share of the list (r/world of the way in): the ranks claim
    disjoint keys first and meet their peers' finished keys at the end."""
    if world <= 1 or not tasks:
        return list(tasks)
    start = (len(tasks) * rank) // world
    return list(tasks[start:]) + list(tasks[:start])


def _config_value(text: str, current: Any) -> Any:
    """A recorded str(config value) back in the type of the current value."""
    if text == "None":
        return None
    if isinstance(current, bool):
        return text == "True"
    if isinstance(current, int):
        return int(text)
    if isinstance(current, float):
        return float(text)
    return text


@contextlib.contextmanager
def _recorded_settings(task: WarmTask) -> Iterator[None]:
    """Compile under the settings that are part of the recorded key (precision, Inductor
    flags, CPU threads, reduced-precision reductions), so this machine's key matches the
    one a job with those settings computes."""
    import torch
    from torch._inductor import config

    patches: dict[str, Any] = {}
    for name, text in task.env.items():
        if not name.startswith("inductor."):
            continue
        flag = name[len("inductor."):]
        obj: Any = config
        try:
            for part in flag.split("."):
                obj = getattr(obj, part)
            if str(obj) != text:
                patches[flag] = _config_value(text, obj)
        except (AttributeError, ValueError):
            logger.debug("tunecache warm: cannot apply recorded %s=%s", name, text)
    old_precision = torch.get_float32_matmul_precision()
    old_threads = torch.get_num_threads()
    matmul = torch.backends.cuda.matmul
    old_reduced = (matmul.allow_fp16_reduced_precision_reduction,
                   matmul.allow_bf16_reduced_precision_reduction)
    try:
        torch.set_float32_matmul_precision(task.precision)
        if task.env.get("device_type") == "cpu" and task.env.get("threads", "").isdigit():
            torch.set_num_threads(int(task.env["threads"]))
        if "fp16_reduced_reduction" in task.env:
            matmul.allow_fp16_reduced_precision_reduction = task.env["fp16_reduced_reduction"] == "True"
        if "bf16_reduced_reduction" in task.env:
            matmul.allow_bf16_reduced_precision_reduction = task.env["bf16_reduced_reduction"] == "True"
        with config.patch(patches):
            yield
    finally:
        torch.set_float32_matmul_precision(old_precision)
        torch.set_num_threads(old_threads)
        (matmul.allow_fp16_reduced_precision_reduction,
         matmul.allow_bf16_reduced_precision_reduction) = old_reduced


def _make_tensor(spec: Input, device: Any) -> Any:
    import torch

    dtype = getattr(torch, spec.dtype.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {spec.dtype}")
    extent = spec.offset + 1 + sum((s - 1) * st for s, st in zip(spec.size, spec.stride)
                                   if s > 0)
    if dtype.is_floating_point:
        base = torch.randn(max(extent, 1), device=device).to(dtype)
    else:
        base = torch.randint(-8, 8, (max(extent, 1),), device=device).to(dtype)
    return base.as_strided(spec.size, spec.stride, spec.offset)


def _op_fn(op: str) -> Callable[..., Any]:
    import torch

    fns = {"mm": torch.mm, "addmm": torch.addmm, "bmm": torch.bmm, "baddbmm": torch.baddbmm}
    fn = fns[op]

    def gemm(*args: Any) -> Any:
        return fn(*args)

    return gemm


def _device_for(device_type: str, local_rank: int) -> Any:
    import torch

    if device_type == "cpu":
        return torch.device("cpu")
    module = getattr(torch, device_type, None)
    if module is None or not module.is_available():
        raise RuntimeError(f"no {device_type} device on this machine")
    index = local_rank % max(1, module.device_count())
    return torch.device(device_type, index)


def warm(
    settings: Settings,
    db: Database,
    tasks: Sequence[WarmTask],
    *,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Compile every task with tunecache enabled; returns counts and per-task outcomes."""
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    import torch
    import torch._dynamo
    from torch._inductor import config

    import tunecache
    from tunecache import inductor as tc_inductor

    progress = progress or (lambda _n: None)
    rank, world, local_rank = _rank()
    cache = tunecache.TuneCache(settings)
    if not tc_inductor.enable(cache):
        cache.close()
        raise RuntimeError("tunecache.inductor.enable() refused (see the warning above)")
    counts = {"tuned": 0, "hit": 0, "peer": 0, "local": 0, "not_autotuned": 0, "error": 0}
    outcomes: list[dict[str, Any]] = []
    scratch = tempfile.mkdtemp(prefix="tunecache-warm-")
    old_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    started = time.perf_counter()
    try:
        with config.patch({"fx_graph_cache": False, "autotune_local_cache": False,
                           "autotune_remote_cache": False}):
            for i, task in enumerate(_my_order(tasks, rank, world)):
                outcome = _warm_one(task, i, scratch, local_rank, torch, tc_inductor, cache)
                counts[outcome["outcome"]] += 1
                outcomes.append(outcome)
                progress(1)
    finally:
        tc_inductor.disable()
        cache.close()
        if old_dir is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old_dir
        shutil.rmtree(scratch, ignore_errors=True)
    return {"database": db.display_url, "rank": rank, "world_size": world, "keys": len(tasks),
            **counts, "seconds": time.perf_counter() - started, "tasks": outcomes}


def _already_done(task: WarmTask, device_type: str, tc_inductor: Any, cache: Any) -> str | None:
    """This machine's key for ``task``, if the cache already has it done (else None).

    Read straight from the store: a warm-up's look is not a hit a job had, so it must not
    count in the usage figures. (An entry whose candidate set differs from what this
    compile would build is topped up by the next job; warm does not chase that.)
    """
    from .keys import key_hash

    with _recorded_settings(task):
        key = tc_inductor.make_key(task.op, task.inputs, None, device_type)
    h, _ = key_hash(key)
    row = cache.store.read([h]).get(h)
    return h if row is not None and row.state == "done" else None


def _warm_one(task: WarmTask, i: int, scratch: str, local_rank: int, torch: Any,
              tc_inductor: Any, cache: Any) -> dict[str, Any]:
    record: dict[str, Any] = {**task.as_dict()}
    t0 = time.perf_counter()
    try:
        specs = parse_inputs(task.inputs)
        device = _device_for(specs[0].device_type, local_rank)
        try:
            done = _already_done(task, specs[0].device_type, tc_inductor, cache)
        except Exception as e:  # noqa: BLE001 - the pre-check only saves time; compile
            logger.debug("tunecache warm: pre-check failed: %r", e)
            done = None
        if done is not None:
            record.update(outcome="hit", benchmarks=0, key_hashes=[done],
                          seconds=time.perf_counter() - t0)
            return record
        args = [_make_tensor(s, device) for s in specs]
        # A fresh Inductor cache directory per compile: nothing local may answer for us.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, str(i))
        torch._dynamo.reset()
        tc_inductor.stats.reset()
        with _recorded_settings(task), torch.no_grad():
            compiled = torch.compile(_op_fn(task.op), mode="max-autotune-no-cudagraphs",
                                     dynamic=False)
            compiled(*args)
        s = tc_inductor.stats
        if s.tuned:
            outcome = "tuned"
        elif s.peer:
            outcome = "peer"
        elif s.local or s.fallbacks:
            outcome = "local"
        elif s.hits or s.memo:
            outcome = "hit"
        else:
            # Inductor had one candidate (e.g. fp32 mm on CPU) and asked nobody.
            outcome = "not_autotuned"
        record.update(outcome=outcome, benchmarks=s.benchmarks,
                      key_hashes=sorted({e["key_hash"] for e in s.events if e.get("key_hash")}))
    except Exception as e:  # noqa: BLE001 - one bad key must not stop a nightly warm-up
        logger.warning("tunecache warm: %s %s failed: %s: %s", task.op, task.inputs,
                       type(e).__name__, e)
        record.update(outcome="error", error=f"{type(e).__name__}: {e}")
    record["seconds"] = time.perf_counter() - t0
    return record


def summary_keys(report: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "tasks"}
