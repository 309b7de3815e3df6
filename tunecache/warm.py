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
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

from .settings import Settings
from .store import Database
from .store import admin

__all__ = ["WARM_OPS", "NOT_WARMED", "WarmTask", "select_tasks", "warm", "parse_inputs",
           "check_inputs", "build_call", "classify"]

logger = logging.getLogger("tunecache")

# Op names as Inductor's lowerings pass them to the autotuner (torch 2.11-2.14), and the
# call warm compiles for each; its tensors come from the recorded inputs key, in key order.
WARM_OPS: dict[str, str] = {
    "mm": "torch.mm(a, b)",
    "addmm": "torch.addmm(bias, a, b)",
    "bmm": "torch.bmm(a, b)",
    "baddbmm": "torch.baddbmm(bias, a, b)",
    # kernel/mm.py tuned_int_mm (the aten._int_mm lowering): int8 x int8 -> int32.
    "int_mm": "torch._int_mm(a, b)",
    # kernel/mm_plus_mm.py tuned_mm_plus_mm is no aten lowering: the post-grad pattern
    # fx_passes/post_grad.py mm_plus_mm rewrites aten.add(aten.mm(a, b), aten.mm(c, d)),
    # the mm's used only by that add, when is_valid_mm_plus_mm holds (max_autotune or
    # max_autotune_gemm, and a:(M,K) b:(K,N) c:(M,K') d:(K',N)). tuned_mm_plus_mm then
    # autotunes "mm_plus_mm" over inputs (a, b, c, d) only if a, c and b, d have equal
    # sizes, M*N != 0 and triton.native_matmul is off; otherwise it lowers to two "mm".
    # The pattern has no device check and fires on CPU too, but there Inductor has a
    # single candidate (aten _mm_plus_mm; the Triton template needs a GPU or
    # cpu_backend="triton"), so it autotunes nothing and a CPU key comes out
    # not_autotuned. mm_plus_mm needs config.pattern_matcher (on by default).
    "mm_plus_mm": "torch.mm(a, b) + torch.mm(c, d)",
}

# Number of tensors in each op's inputs key (the nodes the lowering passes to the
# selector: kernel/mm.py, kernel/bmm.py, kernel/mm_plus_mm.py).
_ARITY = {"mm": 2, "addmm": 3, "bmm": 2, "baddbmm": 3, "int_mm": 2, "mm_plus_mm": 4}

# Why other ops a job can record (every op that goes through Inductor's algorithm
# selector is a "gemm" key) are not warmed: warm can only compile a call it can rebuild
# from the inputs key alone.
NOT_WARMED: dict[str, str] = {
    "scaled_mm": "scaled_mm's out_dtype, use_fast_accum and scaling recipe are not in the "
                 "inputs key, so warm cannot rebuild the call",
    "packed_linear": "packed_linear needs a frozen nn.Linear whose weight Inductor packs; "
                     "the inputs key does not give the module",
    "_weight_int8pack_mm": "a weight-only quantized linear: the inputs key does not give "
                           "the packed weight and scales",
    "_weight_int4pack_mm_for_cpu": "a weight-only quantized linear: the inputs key does "
                                   "not give the packed weight and scales",
}


def not_warmed_reason(op: str) -> str:
    """Why a recorded key of ``op`` (not in WARM_OPS) is skipped."""
    reason = NOT_WARMED.get(op)
    if reason is None:
        reason = f"warm cannot rebuild a {op!r} call from its inputs key"
    return f"op {op!r} is not warmed: {reason} (warm covers {', '.join(WARM_OPS)})"


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


def check_inputs(op: str, specs: Sequence[Input]) -> None:
    """Raise ValueError unless ``specs`` are inputs the call warm compiles for ``op`` can
    take and that lead Inductor to autotune ``op`` over exactly these inputs."""
    want = _ARITY.get(op)
    if want is not None and len(specs) != want:
        raise ValueError(f"{op} takes {want} inputs, the inputs key has {len(specs)}")
    if op == "int_mm":
        a, b = specs
        if (a.dtype, b.dtype) != ("torch.int8", "torch.int8"):
            raise ValueError(f"int_mm needs int8 inputs, not {a.dtype} and {b.dtype}")
        if len(a.size) != 2 or len(b.size) != 2 or a.size[1] != b.size[0]:
            raise ValueError(f"int_mm inputs {a.size} x {b.size} do not multiply")
    elif op == "mm_plus_mm":
        a, b, c, d = specs
        if any(len(s.size) != 2 for s in specs):
            raise ValueError("mm_plus_mm inputs must all be matrices")
        if len({(s.device_type, s.dtype) for s in specs}) != 1:
            raise ValueError("mm_plus_mm inputs differ in device type or dtype")
        # tuned_mm_plus_mm (kernel/mm_plus_mm.py) autotunes only if a, c and b, d have the
        # same sizes and the product is not empty; otherwise it lowers to two "mm".
        if a.size != c.size or b.size != d.size or a.size[1] != b.size[0]:
            raise ValueError(f"mm_plus_mm inputs {a.size} x {b.size} + {c.size} x {d.size}"
                             " are not two products of equal sizes")
        if a.size[0] * b.size[1] == 0:
            raise ValueError("mm_plus_mm of an empty product is never autotuned")


def select_tasks(
    db: Database,
    ops: Sequence[str] | None = None,
    *,
    from_torch: Sequence[str] = (),
    from_device: Sequence[str] = (),
    limit: int | None = None,
) -> tuple[list[WarmTask], list[dict[str, str]]]:
    """Distinct recorded GEMMs of ``ops`` (done gemm entries), and the keys skipped.

    ``ops`` None: every recorded gemm key; those of ops warm cannot rebuild (not in
    WARM_OPS) come back in the skipped list, each with its reason.
    """
    env = admin.EntryFilter(only={"torch": list(from_torch), "device": list(from_device)},
                            ops=list(ops or ()), kinds=["gemm"])
    tasks: dict[tuple[str, str, str], WarmTask] = {}
    skipped: list[dict[str, str]] = []
    after = ""
    while True:
        page = db.run(lambda c: c.execute(admin.select_done_page(env, after, 1000)).all())
        if not page:
            break
        for row in page:
            op = None
            try:
                key = json.loads(row.key_json)
                op = str(key["op"])
                if op not in WARM_OPS:
                    raise ValueError(not_warmed_reason(op))
                inputs = key["inputs"]
                check_inputs(op, parse_inputs(inputs))
                if key.get("hint_override") is not None:
                    raise ValueError("recorded with a hint override (dynamic shapes)")
                if key.get("extra_candidates"):
                    continue  # a top-up entry of a base key that is warmed anyway
                task_env = {k: str(v) for k, v in (key.get("env") or {}).items()}
                task = WarmTask(op, inputs, str(key.get("precision", "highest")), task_env)
            except (ValueError, KeyError, TypeError) as e:
                skipped.append({"key_hash": row.key_hash, "op": op, "reason": str(e)})
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


def _make_base(spec: Input, device: Any) -> Any:
    """A 1-D tensor holding every element of ``spec``'s view (from storage offset 0)."""
    import torch

    dtype = getattr(torch, spec.dtype.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {spec.dtype}")
    extent = spec.offset + 1 + sum((s - 1) * st for s, st in zip(spec.size, spec.stride)
                                   if s > 0)
    if dtype.is_floating_point:
        return torch.randn(max(extent, 1), device=device).to(dtype)
    return torch.randint(-8, 8, (max(extent, 1),), device=device).to(dtype)


def _make_tensor(spec: Input, device: Any) -> Any:
    return _make_base(spec, device).as_strided(spec.size, spec.stride, spec.offset)


def build_call(op: str, specs: Sequence[Input], device: Any) -> tuple[Callable[..., Any],
                                                                       list[Any]]:
    """The function warm compiles for ``op`` and the arguments to call it with.

    An input recorded at a storage offset is passed as its whole storage and viewed inside
    the function: Inductor keys a graph input at offset 0 whatever its storage offset, but
    keys a view of an input (as a job's GEMM on a slice of a bigger buffer) at its offset.
    """
    import torch

    fn = _op_fn(op)
    if not any(s.offset for s in specs):
        return fn, [_make_tensor(s, device) for s in specs]
    views = [(s.size, s.stride, s.offset) if s.offset else None for s in specs]

    def viewed(*args: Any) -> Any:
        return fn(*(a if v is None else torch.as_strided(a, *v) for a, v in zip(args, views)))

    return viewed, [_make_base(s, device) if s.offset else _make_tensor(s, device)
                    for s in specs]


def _op_fn(op: str) -> Callable[..., Any]:
    """The one-op function whose compile autotunes ``op`` over its arguments, which are
    the tensors of the recorded inputs key in key order (see WARM_OPS)."""
    import torch

    if op == "mm_plus_mm":
        def mm_plus_mm(a: Any, b: Any, c: Any, d: Any) -> Any:
            # Exactly the post-grad pattern add(mm(a, b), mm(c, d)): each mm used once.
            return torch.mm(a, b) + torch.mm(c, d)

        return mm_plus_mm
    fns = {"mm": torch.mm, "addmm": torch.addmm, "bmm": torch.bmm, "baddbmm": torch.baddbmm,
           "int_mm": torch._int_mm}
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
        with tc_inductor.local_caches_off():
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


def _this_key_hash(task: WarmTask, device_type: str, tc_inductor: Any) -> str:
    """The hash of this machine's key for ``task``: what the compile must look up."""
    from .keys import key_hash

    with tc_inductor.recorded_settings(task.precision, task.env):
        key = tc_inductor.make_key(task.op, task.inputs, None, device_type)
    return key_hash(key)[0]


def _is_done(h: str, cache: Any) -> bool:
    """Whether the cache already has key ``h`` done.

    Read straight from the store: a warm-up's look is not a hit a job had, so it must not
    count in the usage figures. (An entry whose candidate set differs from what this
    compile would build is topped up by the next job; warm does not chase that.)
    """
    row = cache.store.read([h]).get(h)
    return row is not None and row.state == "done"


# The outcome of a compile that looked up the task's own key, by the lookup's source, in
# order of precedence (tunecache.inductor.Stats events).
_SOURCE_OUTCOME = (("tuned", "tuned"), ("peer", "peer"), ("local", "local"),
                   ("hit", "hit"), ("memo", "hit"))


def classify(events: Sequence[Mapping[str, Any]], fallbacks: int,
             expected: str) -> tuple[str, str | None]:
    """(outcome, reason) of one warm compile from the hook's lookup events.

    Only a lookup of ``expected`` (this machine's key for the recorded op and inputs)
    warms the task: a compile that autotuned other keys, or nothing, is not_autotuned,
    with the reason.
    """
    sources = {e.get("source") for e in events if e.get("key_hash") == expected}
    for source, outcome in _SOURCE_OUTCOME:
        if source in sources:
            return outcome, None
    if fallbacks:
        # tunecache failed (warned above); Inductor's own lookup answered, unshared.
        return "local", "tunecache failed during the lookup; Inductor tuned locally"
    others = sorted({f"{e.get('op')} {str(e.get('key_hash'))[:12]}" for e in events
                     if e.get("key_hash")})
    if others:
        return "not_autotuned", ("the compile autotuned other keys (" + ", ".join(others)
                                 + "), not this machine's key for the recorded op and "
                                 "inputs")
    return "not_autotuned", ("Inductor autotuned nothing: it had a single candidate for "
                             "this op here (e.g. fp32 mm, int_mm or mm_plus_mm on CPU: "
                             "ATen only), so no job benchmarks this key on this machine")


def _warm_one(task: WarmTask, i: int, scratch: str, local_rank: int, torch: Any,
              tc_inductor: Any, cache: Any) -> dict[str, Any]:
    record: dict[str, Any] = {**task.as_dict()}
    t0 = time.perf_counter()
    try:
        specs = parse_inputs(task.inputs)
        check_inputs(task.op, specs)
        device = _device_for(specs[0].device_type, local_rank)
        expected = _this_key_hash(task, specs[0].device_type, tc_inductor)
        try:
            done = _is_done(expected, cache)
        except Exception as e:  # noqa: BLE001 - the pre-check only saves time; compile
            logger.debug("tunecache warm: pre-check failed: %r", e)
            done = False
        if done:
            record.update(outcome="hit", benchmarks=0, key_hashes=[expected],
                          seconds=time.perf_counter() - t0)
            return record
        fn, args = build_call(task.op, specs, device)
        # A fresh Inductor cache directory per compile: nothing local may answer for us.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, str(i))
        torch._dynamo.reset()
        tc_inductor.stats.reset()
        tc_inductor.compile_and_run(fn, args, task.precision, task.env)
        s = tc_inductor.stats.as_dict()
        outcome, reason = classify(s["events"], s["fallbacks"], expected)
        record.update(outcome=outcome, benchmarks=s["benchmarks"],
                      key_hashes=sorted({e["key_hash"] for e in s["events"]
                                         if e.get("key_hash")}))
        if reason is not None:
            record["reason"] = reason
    except Exception as e:  # noqa: BLE001 - one bad key must not stop a nightly warm-up
        logger.warning("tunecache warm: %s %s failed: %s: %s", task.op, task.inputs,
                       type(e).__name__, e)
        record.update(outcome="error", error=f"{type(e).__name__}: {e}")
    record["seconds"] = time.perf_counter() - t0
    return record

