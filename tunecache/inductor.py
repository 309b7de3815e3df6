"""PyTorch Inductor integration: GEMM autotuning timings from the shared tunecache.

This is the only tunecache module that touches ``torch._inductor`` internals. With
``triton_configs`` on, the best configs of Triton kernels (autotune_to_one_config,
coordinate descent, split across ranks in a cold job) and the timings of the scheduler's
fusion and split-size benchmarks are shared too. Those hooks (Inductor's remote autotune
cache, ``AutotuneCache.create``, ``CachingAutotuner.coordinate_descent_tuning``,
``.autotune_to_one_config`` and ``._dynamic_scale_rblock``,
``TritonScheduling.benchmark_codegened_module`` and
``CoordescTuner.autotune_single_field``) and why each is safe are in the "Triton kernel
autotune" section below and docs/triton-autotune.md.

Supported torch versions: 2.11, 2.12, 2.13, 2.14. On any other version :func:`enable`
logs one warning and installs nothing, so Inductor behaves exactly as it would without
tunecache. The hooks were read in the 2.11, 2.13 and 2.14 sources and run on 2.13 (CPU);
:func:`enable` also checks the hooked methods' signatures, so a 2.12 or a patched build
that changed them is refused the same way.

Hooks, and why each is safe
---------------------------
All GEMM (and convolution) autotuning goes through the process-wide singleton
``torch._inductor.select_algorithm.get_algorithm_selector_cache()``. We override two
methods on that *instance* with ``types.MethodType``; the class, the lowering registry
and every other instance are untouched, and :func:`disable` deletes the instance
attributes, which restores the class methods.

``lookup(choices, op, inputs, benchmark, hint_override=None)``
    Inherited from ``codecache.PersistentCache`` (2.11-2.14, same signature). It is the
    one place Inductor gets timings from, on the immediate path (``do_autotuning``) and
    on the deferred path (``MultiTemplateBuffer.choice_timings`` -> ``get_timings`` ->
    ``do_autotuning``), and ``benchmark(choices)`` returns ``{choice: ms}`` for any
    subset. We answer with timings from the shared cache and call ``benchmark`` only for
    keys (or candidates) nobody has measured yet. The return value has exactly the shape
    Inductor's own lookup returns, so everything downstream (winner selection,
    ``min_speedup_threshold``, feedback functions, logging) is unchanged.
    ``lookup(..., benchmark=None)`` is Inductor's probe from ``make_precompile_fn``: a
    full answer there makes Inductor skip precompiling the candidates, exactly as a hit in
    its own local cache does.
``make_precompile_fn(choices, name, inputs_key, precompilation_timeout_seconds)``
    Called by ``AlgorithmSelectorCache.__call__`` for every autotuned op, before a
    ``MultiTemplateBuffer`` is built on the deferred path, with the same ``choices`` list
    object that buffer keeps. We record (op name, inputs key) for that list so the
    pre-fusion pass can compute each deferred GEMM's key, then call Inductor's own method.
    Nothing is returned differently.

We deliberately do not patch ``tuned_mm`` & co (the lowering registry holds references
to the originals), ``autotune_select_algorithm`` (modules import it by name) or
``AlgorithmSelectorCache.__call__`` (its return type changed: 2.11 returns the node,
2.13+ returns ``(node, choice)``).

Deferred path (GPU default, ``benchmark_epilogue_fusion=True``)
    Lowering returns ``MultiTemplateBuffer``s whose timings are computed lazily, one at a
    time, during fusion. We chain ``config._pre_fusion_custom_pass`` (keeping any pass
    already there: it runs first) to see all of the graph's deferred GEMMs at once, call
    ``get_or_tune_many`` over their keys, and tune a key by calling the buffer's
    ``choice_timings()`` (what Inductor's own distributed autotune does). So every rank
    benchmarks only the keys it claimed and waits for its peers only at the end. Ranks
    that compile different graphs cannot hang: a rank waits only for keys that a peer
    has claimed, and a claimer tunes every key it claims before it waits; an expired
    claim is taken over by the core. Our pass is a ``CustomSchedulerPass`` (torch 2.13)
    and a ``CustomGraphPass`` (what torch 2.11's cache checks) with a stable ``uuid()``,
    so the FX graph and AOTAutograd caches keep working (anything else makes Inductor
    bypass them, torch/_inductor/codecache.py); if the pass we chain is a raw callable we
    stay a raw callable too, so Inductor still bypasses as it would have.

Keys and candidate identities
    key = environment fingerprint (device model and capability or CPU model, vector ISA
    and threads; torch, triton, CUDA and HIP versions; the Inductor config flags that
    change the candidate set or numerics) + op name + Inductor's ``inputs_key`` (dtype,
    size and stride hints, no device index) + ``torch.get_float32_matmul_precision()`` +
    ``hint_override``. Timings are stored per candidate under an identity that is the
    same on every rank: extern kernels' ``hash_key()`` (name, kwargs, source hash);
    Triton templates' (template name, description), because their ``hash_key()`` hashes
    generated source that embeds the device index; anything else (C++ templates,
    CUTLASS, subgraphs) its ``hash_key()``. A compile whose candidates are not all in the
    stored entry tunes only the missing ones, under the derived key
    ``{**key, "extra_candidates": sorted(missing)}`` (entries are immutable), and merges.
    Stored candidates this compile lacks are ignored.

Every rank picks the same winner: its timings come from the one shared entry.

``distributed_max_autotune_gemm``
    Inductor's own distributed autotune (2.11-2.14: aten.mm only, all ranks must compile
    identical graphs, all_gather over NCCL, nothing persists) and tunecache replace the
    same thing. When tunecache is enabled it wins: :func:`enable` turns the flag off with
    one info log. tunecache covers every GEMM op, tolerates ranks that compile different
    graphs and persists across jobs, so keeping both would only add an all_gather whose
    placeholders (``_DistributedAutotuneBuffer``) bypass the shared cache. If the flag is
    switched on again later (``config.patch``), tunecache logs one warning and still
    serves every GEMM that reaches ``lookup``.

Failures
    Store trouble never raises out of the core (it tunes locally). Anything else that goes
    wrong in tunecache during a compile logs one warning and falls back to Inductor's own
    lookup for that op (re-using a benchmark already taken), so the compile succeeds.
    Exceptions raised by Inductor's benchmark propagate exactly as without tunecache.

Counting
    :data:`stats` counts the calls of Inductor's benchmark callable that went through our
    hook. ``enable(count_only=True)`` installs only a counting wrapper (no cache), to
    measure plain max-autotune or ``distributed_max_autotune_gemm`` the same way.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import math
import os
import platform
import re
import sys
import threading
import time
import types
import weakref
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Sequence

from . import keys as tc_keys

if TYPE_CHECKING:  # pragma: no cover - typing only; importing the core stays lazy
    from . import TuneCache

__all__ = [
    "enable",
    "disable",
    "is_enabled",
    "stats",
    "Stats",
    "SUPPORTED_TORCH",
    "candidate_id",
    "candidate_ids",
    "environment",
    "make_key",
    "triton_stats",
    "TritonStats",
    "triton_key",
    "triton_kernel_info",
    "TRITON_LEASE_SECONDS",
]

log = logging.getLogger("tunecache")

# (major, minor) bounds, inclusive. See the module docstring for what was checked.
SUPPORTED_TORCH: tuple[tuple[int, int], tuple[int, int]] = ((2, 11), (2, 14))

# The hooked methods' parameter names in every supported version. If a build differs, we
# refuse to hook rather than guess (one warning, Inductor's own behaviour).
_LOOKUP_PARAMS = ("choices", "op", "inputs", "benchmark", "hint_override")
_PRECOMPILE_PARAMS = ("choices", "name", "inputs_key", "precompilation_timeout_seconds")

# Inductor config flags that change the candidate set or the numerics of a GEMM; read per
# lookup because users patch them per compile (torch/_inductor/config.py, 2.11-2.14).
# A dotted name reads a nested config class; a missing flag reads as "-".
_CONFIG_FLAGS = (
    "max_autotune_gemm_backends",
    "max_autotune_gemm_search_space",
    "max_autotune_conv_backends",
    "emulate_precision_casts",
    "cpu_backend",
    "cuda_backend",
    "cpp.simdlen",
    "triton.enable_persistent_tma_matmul",
    "triton.use_tensor_descriptor",
    "cuda.cutlass_max_profiling_configs",
    "cuda.cutlass_op_allowlist_regex",
    "cuda.cutlass_op_denylist_regex",
)


# --------------------------------------------------------------------------- counting


class _Counters:
    """reset() and as_dict() for a dataclass of counters guarded by its ``_lock``."""

    _lock: threading.Lock

    def reset(self) -> None:
        with self._lock:
            fresh = type(self)()
            for f in dataclasses.fields(self):  # type: ignore[arg-type]
                if f.name != "_lock":
                    setattr(self, f.name, getattr(fresh, f.name))

    def as_dict(self) -> dict[str, Any]:
        """A copy: the lists and dicts in it are the caller's."""
        with self._lock:
            return {
                f.name: copy.deepcopy(getattr(self, f.name))
                for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if f.name != "_lock"
            }


@dataclasses.dataclass
class Stats(_Counters):
    """What the hooks did in this process; read it after a compile.

    ``benchmarks`` is the number of calls of Inductor's benchmark callable that went
    through the hook (one per key or candidate subset measured here), in every mode;
    ``benchmarks_by_key`` counts them by the key they measured (a top-up of candidates
    missing from a stored entry has a key of its own, see ``extra_candidates``).
    """

    benchmarks: int = 0
    benchmarks_by_key: dict[str, int] = dataclasses.field(default_factory=dict)
    candidates_benchmarked: int = 0
    benchmark_seconds: float = 0.0
    # lookups that wanted timings (not precompile probes), by where the timings came from
    hits: int = 0  # already in the shared cache (source "hit")
    peer: int = 0  # tuned by a concurrent peer while we waited (source "peer")
    tuned: int = 0  # tuned here and published (source "tuned")
    local: int = 0  # tuned here, not published (store down, or readonly mode)
    memo: int = 0  # an entry this process had already read or written (same key again)
    fallbacks: int = 0  # tunecache failed; Inductor's own lookup answered
    # one dict per lookup that wanted timings: op, key hash, source, best, benchmarked
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    _lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, repr=False, compare=False
    )

    def _count_benchmark(self, n_choices: int, seconds: float, key_hash: str | None) -> None:
        with self._lock:
            self.benchmarks += 1
            if key_hash is not None:
                self.benchmarks_by_key[key_hash] = self.benchmarks_by_key.get(key_hash, 0) + 1
            self.candidates_benchmarked += n_choices
            self.benchmark_seconds += seconds

    def _record(self, source: str, event: dict[str, Any]) -> None:
        with self._lock:
            attr = {"hit": "hits", "fallback": "fallbacks"}.get(source, source)
            if hasattr(self, attr):
                setattr(self, attr, getattr(self, attr) + 1)
            self.events.append({"source": source, **event})


stats = Stats()


# ----------------------------------------------------------------- keys and identities


def _torch_version() -> tuple[int, int] | None:
    import torch

    try:
        major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return None
    return major, minor


def _dist_version(*names: str) -> str:
    # importlib.metadata, not `import triton`: cheap, and the key must not depend on
    # whether someone imported triton yet.
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


@functools.lru_cache(maxsize=None)
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


@functools.lru_cache(maxsize=None)
def _device_env(device_type: str) -> tuple[tuple[str, str], ...]:
    """Hardware part of the fingerprint for one device type (cached: it cannot change)."""
    import torch

    env: dict[str, str] = {}
    if device_type == "cuda" and torch.cuda.is_available():
        # Name and capability only, never the index: ranks on GPUs 0..7 share keys.
        idx = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(idx)
        env["device"] = torch.cuda.get_device_name(idx)
        env["capability"] = f"{major}.{minor}"
    elif device_type == "cpu":
        env["device"] = _cpu_model()
        try:
            from torch._inductor import cpu_vec_isa

            env["isa"] = str(cpu_vec_isa.pick_vec_isa()) or "none"
        except Exception:  # noqa: BLE001 - the ISA only refines the key; never fail on it
            env["isa"] = "unknown"
    else:
        try:
            env["device"] = torch.get_device_module(device_type).get_device_name()
        except Exception:  # noqa: BLE001 - unknown backends still get a usable key
            env["device"] = device_type
    env["device_type"] = device_type
    return tuple(sorted(env.items()))


def _config_value(name: str) -> str:
    from torch._inductor import config

    obj: Any = config
    for part in name.split("."):
        obj = getattr(obj, part, "-")
    return str(obj)


def environment(device_type: str) -> dict[str, str]:
    """The environment fingerprint of a key: everything outside the op that changes the
    candidates or their timings. All values are strings (the key convention)."""
    import torch

    env = dict(_device_env(device_type))
    env["torch"] = str(torch.__version__)
    env["triton"] = _dist_version("triton", "pytorch-triton", "pytorch-triton-rocm")
    env["cuda"] = str(torch.version.cuda or "none")
    env["hip"] = str(getattr(torch.version, "hip", None) or "none")
    if device_type == "cpu":
        # CPU GEMM timings scale with the thread count; a 4-thread winner is not a
        # 64-thread winner.
        env["threads"] = str(torch.get_num_threads())
    if device_type == "cuda":
        matmul = torch.backends.cuda.matmul
        env["fp16_reduced_reduction"] = str(matmul.allow_fp16_reduced_precision_reduction)
        env["bf16_reduced_reduction"] = str(matmul.allow_bf16_reduced_precision_reduction)
    for flag in _CONFIG_FLAGS:
        env[f"inductor.{flag}"] = _config_value(flag)
    return env


def _unwrap(choice: Any) -> Any:
    # DataProcessorChoiceCallerWrapper (CPU packed GEMMs) forwards attributes but is no
    # subclass of ChoiceCaller (torch/_inductor/select_algorithm.py, 2.11-2.14).
    while hasattr(choice, "_wrapped"):
        choice = choice._wrapped
    return choice


def candidate_id(choice: Any) -> str:
    """A candidate's identity, equal on every rank and every process of one environment."""
    from torch._inductor.ir import TritonTemplateCallerBase
    from torch._inductor.select_algorithm import ExternKernelCaller

    inner = _unwrap(choice)
    if isinstance(inner, ExternKernelCaller):
        return f"extern:{choice.hash_key()}"
    if isinstance(inner, TritonTemplateCallerBase):
        # hash_key() hashes generated source that embeds the device index; the template
        # name (the caller's name without its counter, as hash_key() itself strips it)
        # and the config description identify the kernel on any GPU of the same model.
        return f"triton:{inner.name.rsplit('_', 1)[0]}:{inner.description}"
    return f"{type(inner).__name__}:{choice.hash_key()}"


def candidate_ids(choices: Sequence[Any]) -> list[str]:
    """Identities for a choice list; duplicates (same kernel twice) get ``#n`` suffixes in
    list order, which is the same on every rank that built the same list."""
    seen: dict[str, int] = {}
    out = []
    for choice in choices:
        cid = candidate_id(choice)
        n = seen.get(cid, 0)
        seen[cid] = n + 1
        out.append(cid if n == 0 else f"{cid}#{n + 1}")
    return out


def _device_type(choices: Sequence[Any], inputs: str) -> str:
    for choice in choices:
        layout = getattr(choice, "layout", None)
        device = getattr(layout, "device", None)
        if device is not None:
            return str(device.type)
    # inputs_key is a repr of tuples that start with the device type
    return inputs.split("'")[1] if inputs.count("'") >= 2 else "unknown"


def make_key(
    op: str, inputs: str, hint_override: int | None, device_type: str
) -> dict[str, Any]:
    """The shared-cache key of one autotuned op (see the module docstring)."""
    import torch

    return {
        "kind": "gemm",
        "op": op,
        "env": environment(device_type),
        "inputs": inputs,
        "precision": torch.get_float32_matmul_precision(),
        "hint_override": hint_override,
    }


# ----------------------------------------------------------------------------- hooks


class _BenchmarkFailed(Exception):
    """Carries an exception raised by Inductor's benchmark through the core, so that we
    re-raise it untouched instead of mistaking it for a tunecache failure."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


class _Lowered(NamedTuple):
    """A candidate list as make_precompile_fn saw it, before Inductor pruned it."""

    list_id: int  # id() of the list (MultiTemplateBuffer keeps the same list)
    op: str
    inputs_key: str
    refs: tuple[weakref.ref[Any], ...]


class _Hooks:
    """State of the installed hooks (one per process, see :func:`enable`)."""

    def __init__(
        self,
        selector: Any,
        cache: TuneCache | None,
        settings: dict[str, Any],
        count_only: bool,
    ) -> None:
        self.selector = selector
        self.count_only = count_only
        self._cache = cache
        self._owns_cache = cache is None
        self._settings = settings
        self._broken = False  # the cache could not be opened: Inductor's own from now on
        self._warned = False
        self._lock = threading.RLock()
        # key hash -> timings of entries read or written by this process (immutable)
        self._memo: dict[str, dict[str, float]] = {}
        # key hashes this process is tuning inside get_or_tune_many right now -> timings
        # collected by lookup; shared by all threads (Inductor may benchmark in a pool).
        self._tuning: dict[str, dict[str, float]] = {}
        # choices list (by its first choice, weakly) -> how make_precompile_fn saw it
        self._pending: weakref.WeakKeyDictionary[Any, _Lowered] = weakref.WeakKeyDictionary()
        self.prev_pass: Any = None
        self.our_pass: Any = None
        self.triton_patch: Any = None  # what _enable_triton changed (Triton section)
        self._dist_warned = False

    # -- helpers

    def warn_once(self, what: str, error: BaseException) -> None:
        with self._lock:
            first = not self._warned
            self._warned = True
        if first:
            log.warning(
                "tunecache: %s failed (%s: %s); Inductor's own autotuning takes over for "
                "this op, the compile goes on (further failures are logged at debug level)",
                what,
                type(error).__name__,
                error,
            )
        else:
            log.debug("tunecache: %s failed again: %r", what, error)

    def cache(self) -> TuneCache:
        with self._lock:
            if self._broken:
                raise RuntimeError("the tunecache database could not be opened earlier")
            if self._cache is None:
                import tunecache

                try:
                    self._cache = tunecache.open(**self._settings)
                except BaseException:
                    self._broken = True
                    raise
            return self._cache

    def counted(
        self, benchmark: Callable[[Any], Any], key_hash: str | None = None
    ) -> Callable[[Any], Any]:
        def run(choices: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return benchmark(choices)
            finally:
                stats._count_benchmark(len(choices), time.perf_counter() - t0, key_hash)

        return run

    def _record_counted(
        self, choices: list[Any], op: str, inputs: str, hint_override: int | None
    ) -> str | None:
        """Count-only mode: note which key Inductor looked up (for distinct-key counts)."""
        try:
            key = make_key(op, inputs, hint_override, _device_type(choices, inputs))
            key_hash = tc_keys.key_hash(key)[0]
            stats._record("counted", {"op": op, "key_hash": key_hash, "best": None,
                                      "candidates": len(choices)})
            return key_hash
        except Exception as e:  # noqa: BLE001 - counting must never break a compile
            log.debug("tunecache: could not record a counted lookup: %r", e)
            return None

    def close(self) -> None:
        if self._owns_cache and self._cache is not None:
            try:
                self._cache.close()
            except Exception as e:  # noqa: BLE001 - closing must not break disable()
                log.debug("tunecache: closing the cache failed: %r", e)
        self._cache = None

    def check_distributed_flag(self) -> None:
        from torch._inductor import config

        if getattr(config, "distributed_max_autotune_gemm", False) and not self._dist_warned:
            self._dist_warned = True
            log.warning(
                "tunecache: torch._inductor.config.distributed_max_autotune_gemm was turned "
                "on after tunecache.enable(); Inductor's all_gather autotune now runs for "
                "aten.mm placeholders, which bypass the shared cache. Leave it off while "
                "tunecache is enabled."
            )

    # -- lookup

    def lookup(
        self,
        orig: Callable[..., dict[Any, float]],
        choices: list[Any],
        op: str,
        inputs: str,
        benchmark: Callable[[Any], dict[Any, float]] | None,
        hint_override: int | None,
    ) -> dict[Any, float]:
        if self.count_only or self._broken:
            if benchmark is None:
                return orig(choices, op, inputs, None, hint_override)
            key_hash = None
            if self.count_only:
                key_hash = self._record_counted(choices, op, inputs, hint_override)
            return orig(choices, op, inputs, self.counted(benchmark, key_hash), hint_override)
        # Timings a benchmark produced before tunecache failed: reused by the fallback.
        taken: dict[Any, float] = {}
        try:
            return self._lookup(choices, op, inputs, benchmark, hint_override, taken)
        except _BenchmarkFailed as e:
            raise e.error from None
        except Exception as e:  # noqa: BLE001 - any tunecache failure: Inductor's own path
            self.warn_once(f"looking up {op} timings", e)
            stats._record("fallback", {"op": op, "key_hash": None, "best": None})
            if benchmark is None:
                return orig(choices, op, inputs, None, hint_override)
            if taken and all(c in taken for c in choices):
                return {c: taken[c] for c in choices}
            return orig(choices, op, inputs, self.counted(benchmark), hint_override)

    def _lookup(
        self,
        choices: list[Any],
        op: str,
        inputs: str,
        benchmark: Callable[[Any], dict[Any, float]] | None,
        hint_override: int | None,
        taken: dict[Any, float],
    ) -> dict[Any, float]:
        ids = candidate_ids(choices)
        key = make_key(op, inputs, hint_override, _device_type(choices, inputs))
        key_hash, _ = tc_keys.key_hash(key)

        def bench(subset: list[Any], measured_key: str) -> dict[str, float]:
            """Run Inductor's benchmark on some choices; timings by candidate id."""
            assert benchmark is not None
            t0 = time.perf_counter()
            try:
                raw = benchmark(subset)
            except BaseException as e:
                raise _BenchmarkFailed(e) from e
            finally:
                stats._count_benchmark(len(subset), time.perf_counter() - t0, measured_key)
            taken.update(raw)
            by_choice = dict(zip(map(id, choices), ids))
            # inf for anything the benchmark did not return (Inductor asserts it returns
            # every choice; this is belt and braces for the stored entry).
            return {
                by_choice[id(c)]: _ms(raw.get(c, math.inf)) for c in subset
            }

        if benchmark is None:
            # make_precompile_fn's probe: answer only with a full hit, never claim or wait.
            known = self._probe(key, key_hash, ids)
            if known is not None:
                return {c: known[i] for c, i in zip(choices, ids)}
            return {}

        def tune() -> dict[str, float]:
            """Timings of this lookup's candidates, and ``inf`` for those of its lowering
            that failed to compile (see :meth:`not_compiled`)."""
            failed = self.not_compiled(choices, op, inputs)
            return {**bench(choices, key_hash), **{i: math.inf for i in failed}}

        with self._lock:
            in_tune = self._tuning.get(key_hash)
        if in_tune is not None:
            # We are inside our own get_or_tune_many tune(key) for this key (deferred
            # path): measure and hand the timings back to it, which publishes them.
            measured = tune()
            with self._lock:
                in_tune.update(measured)
            # counted by tune_deferred, which learns the result's source from the core
            return {c: measured[i] for c, i in zip(choices, ids)}

        timings, source = self._get_or_tune(key, key_hash, tune)
        missing = [c for c, i in zip(choices, ids) if i not in timings]
        missing_ids: list[str] = []
        if missing:
            missing_ids = sorted(i for c, i in zip(choices, ids) if i not in timings)
            extra_key = {**key, "extra_candidates": missing_ids}
            extra_hash, _ = tc_keys.key_hash(extra_key)
            extra, _ = self._get_or_tune(extra_key, extra_hash,
                                         lambda: bench(missing, extra_hash))
            timings = {**timings, **{i: extra[i] for i in missing_ids if i in extra}}
        answer = {i: timings.get(i, math.inf) for i in ids}
        best = tc_keys.best_candidate(answer)
        if best is None:
            # Nothing in this compile has a finite stored timing: never trust that.
            raise ValueError(f"no candidate of this {op} compile has a finite stored timing")
        # Which candidates were new says why a key needed a top-up (tools/bench_gpu.py).
        event = {"op": op, "key_hash": key_hash, "best": best, "candidates": len(ids),
                 "missing": len(missing), "missing_ids": missing_ids[:8]}
        stats._record(source, event)
        return {c: answer[i] for c, i in zip(choices, ids)}

    def _probe(
        self, key: Mapping[str, Any], key_hash: str, ids: list[str]
    ) -> dict[str, float] | None:
        with self._lock:
            timings = self._memo.get(key_hash)
        if timings is None:
            result = self.cache().lookup(key)
            if result is None:
                return None
            timings = dict(result.timings)
            with self._lock:
                self._memo[key_hash] = timings
        if not all(i in timings for i in ids) or (
            tc_keys.best_candidate({i: timings[i] for i in ids}) is None
        ):
            return None
        return timings

    def _get_or_tune(
        self, key: Mapping[str, Any], key_hash: str, tune: Callable[[], Mapping[str, float]]
    ) -> tuple[dict[str, float], str]:
        with self._lock:
            timings = self._memo.get(key_hash)
        if timings is not None:
            return timings, "memo"  # this process already read or wrote the entry
        result = self.cache().get_or_tune(key, tune)
        timings = dict(result.timings)
        with self._lock:
            self._memo[key_hash] = timings
        return timings, result.source

    # -- make_precompile_fn

    def note_choices(self, choices: list[Any], name: str, inputs_key: str) -> None:
        if choices:
            try:
                refs = tuple(weakref.ref(c) for c in choices)
                self._pending[choices[0]] = _Lowered(id(choices), name, inputs_key, refs)
            except TypeError:  # not weak-referenceable: the deferred pass skips it
                pass

    def not_compiled(self, choices: list[Any], op: str, inputs: str) -> list[str]:
        """Ids of candidates of this lowering that failed to compile, which Inductor
        removed from ``choices`` before asking for timings.

        Which candidates reach a lookup depends on the path: `tunecache warm`'s compile
        got the list without them, the job after it got them all (2xH200, torch 2.11: a
        Triton mm config that needs more shared memory than the card has, on every mm
        key), so the job benchmarked them as new candidates. Stored as not runnable
        (``inf``), they make both lists full hits of one entry.
        """
        try:
            lowered = self._pending.get(choices[0]) if choices else None
        except TypeError:
            return []
        if lowered is None or (lowered.op, lowered.inputs_key) != (op, inputs):
            return []
        full = [ref() for ref in lowered.refs]
        present = {id(c) for c in choices}
        if any(c is None for c in full) or not any(
            id(c) not in present and getattr(c, "failed", False) is True for c in full
        ):
            return []
        return [i for c, i in zip(full, candidate_ids(full))
                if id(c) not in present and getattr(c, "failed", False) is True]

    # -- deferred path

    def tune_deferred(self, nodes: list[Any]) -> None:
        """Claim, tune and wait for all of a graph's deferred GEMMs in one go."""
        if self.count_only or self._broken:
            return
        from torch._inductor import ir
        from torch._inductor.scheduler import SchedulerNode

        self.check_distributed_flag()
        keys: list[dict[str, Any]] = []
        owners: dict[str, Any] = {}  # key hash -> first buffer with that key
        unknown = 0
        for node in nodes:
            buf = getattr(node, "node", None)
            if not isinstance(node, SchedulerNode) or not isinstance(buf, ir.MultiTemplateBuffer):
                continue
            choices = buf.choices
            if not choices or None in getattr(buf, "_choice_timings", {}):
                continue  # a placeholder (distributed autotune) or already timed
            info = self._pending.get(choices[0])
            if info is None or info.list_id != id(choices):
                unknown += 1  # not lowered through our hook; lookup handles it lazily
                continue
            op, inputs_key = info.op, info.inputs_key
            key = make_key(op, inputs_key, None, _device_type(choices, inputs_key))
            key_hash, _ = tc_keys.key_hash(key)
            with self._lock:
                if key_hash in self._memo:
                    continue
            if key_hash not in owners:
                owners[key_hash] = buf
                keys.append(key)
        if unknown:
            # Expected never; if a torch version stops passing the same list to
            # make_precompile_fn and MultiTemplateBuffer, those GEMMs still go through
            # lookup() one at a time (correct, only less parallel across ranks).
            log.info("tunecache: %d deferred GEMM(s) not recognised; tuned one by one", unknown)
        if not keys:
            return

        def tune(key: Mapping[str, Any]) -> Mapping[str, float]:
            key_hash, _ = tc_keys.key_hash(key)
            slot: dict[str, float] = {}
            with self._lock:
                self._tuning[key_hash] = slot
            try:
                # The buffer's own timing function: precompile, prescreen, benchmark,
                # each benchmark routed through lookup(), which fills `slot`.
                owners[key_hash].choice_timings()
            finally:
                with self._lock:
                    self._tuning.pop(key_hash, None)
            if not slot:
                raise RuntimeError("Inductor produced no timings for this key")
            return slot

        t0 = time.perf_counter()
        results = self.cache().get_or_tune_many(keys, tune)
        with self._lock:
            for result in results:
                # A "failed" key (its tuner failed too often) has no usable timings:
                # lookup() then asks the core again, gets KeyFailedError, and leaves the
                # op to Inductor's own lookup.
                if result.source != "failed" and result.timings:
                    self._memo[result.key_hash] = dict(result.timings)
        for key, result in zip(keys, results):
            event = {"op": key["op"], "key_hash": result.key_hash, "best": result.best,
                     "candidates": len(owners[result.key_hash].choices)}
            stats._record(result.source, event)
        log.info(
            "tunecache: %d deferred GEMM key(s) of this graph ready in %.1fs (%s)",
            len(keys),
            time.perf_counter() - t0,
            ", ".join(sorted({r.source for r in results})),
        )


def _ms(value: Any) -> float:
    try:
        ms = float(value)
    except (TypeError, ValueError):
        return math.inf
    return ms if math.isfinite(ms) and ms >= 0 else math.inf


def _scheduler_pass_bases() -> tuple[type, ...]:
    """The classes Inductor's FX graph cache accepts for ``_pre_fusion_custom_pass``.

    torch 2.13 checks ``isinstance(pass, CustomSchedulerPass)``; torch 2.11, before
    pytorch/pytorch#179050 added that class, checks ``CustomGraphPass`` and reads its
    ``uuid()`` (codecache.py, ``_check_can_cache``). Anything else is a bypass of the FX
    graph cache, and with it of the AOTAutograd cache, on every compile. Deriving from
    each of them that exists satisfies either check.
    """
    from torch._inductor import custom_graph_pass

    names = ("CustomSchedulerPass", "CustomGraphPass")
    return tuple(getattr(custom_graph_pass, n) for n in names if hasattr(custom_graph_pass, n))


def _make_pre_fusion_pass(hooks: _Hooks, prev: Any) -> Any:
    """Our scheduler pass, chained after ``prev`` (see the module docstring)."""
    bases = _scheduler_pass_bases()

    def run(nodes: list[Any]) -> list[Any]:
        if prev is not None:
            nodes = prev(nodes)
        if _HOOKS is hooks:
            try:
                hooks.tune_deferred(nodes)
            except Exception as e:  # noqa: BLE001 - fusion then benchmarks lazily, per key
                # This includes an error of Inductor's own benchmark: fusion asks the same
                # buffer again, and the error is raised there, where Inductor raises it.
                hooks.warn_once("tuning the graph's deferred GEMMs", e)
        return nodes

    if not bases or (prev is not None and not isinstance(prev, bases)):
        # A raw callable makes Inductor bypass the FX graph cache; stay raw so it still
        # does (torch/_inductor/codecache.py, _pre_fusion_custom_pass check).
        def tunecache_pre_fusion_pass(nodes: list[Any]) -> list[Any]:
            return run(nodes)

        tunecache_pre_fusion_pass.tunecache_prev = prev  # type: ignore[attr-defined]
        return tunecache_pre_fusion_pass

    class TuneCachePreFusionPass(*bases):  # type: ignore[misc]
        tunecache_prev = prev

        def __call__(self, nodes: list[Any]) -> list[Any]:  # type: ignore[override]
            return run(nodes)

        def uuid(self) -> Any:
            # The pass changes no generated code (it only benchmarks earlier), so the FX
            # graph cache key needs only the chained pass's identity.
            return ("tunecache-pre-fusion-v1", prev.uuid() if prev is not None else None)

    return TuneCachePreFusionPass()


# ------------------------------------------------------------------ Triton kernel autotune
#
# Everything in this section serves issue 6: the best config of every Triton kernel that
# Inductor autotunes (pointwise, reduction, template ...; the autotune_to_one_config
# benchmark and coordinate descent) goes through the shared cache. docs/triton-autotune.md
# has the reasoning; the facts it rests on (torch 2.13, torch/_inductor/runtime/
# autotune_cache.py and triton_heuristics.py, checked against 2.11's sources):
#
# * Inductor keeps one ``AutotuneCache`` per kernel module. ``check_autotune_cache`` calls
#   ``AutotuneCache.create(inductor_meta, filename, configs_hash)`` when the kernel is
#   loaded, then ``read_best`` -> remote ``get``; ``CachingAutotuner`` calls
#   ``save_cache_hook`` (``AutotuneCache.save`` -> remote ``put``) at the kernel's first
#   run, after autotune_to_one_config and again after coordinate descent.
# * The remote cache is whatever class ``torch._inductor.remote_cache`` exports under the
#   name ``RemoteAutotuneCache`` (``create_cache`` looks it up by name), and it is used
#   when the kernel's ``inductor_meta["autotune_remote_cache"]`` (from
#   ``config.autotune_remote_cache`` at code generation) is true.
# * With parallel compile (the default), kernels load in compile-worker subprocesses;
#   the AutotuneCache built there travels back to the compiling process inside the
#   pickled kernel (CachingAutotuner.__getstate__ keeps save_cache_hook), and the save
#   happens there, at the kernel's first run. Workers start with the parent's environment
#   (SubprocPool, python_subprocess_env), so where tunecache was activated by
#   TUNECACHE_DB and its ``torch.backends`` entry point is installed, the entry point
#   runs in each worker too and :func:`_enable_triton_from_env` plugs the cache in when
#   ``torch._inductor.runtime.autotune_cache`` is imported there (tunecache._autoload).
#   Otherwise (explicit enable() with other settings, or autoload off) the workers could
#   not read the cache and Inductor would try its own Redis class: we then set
#   ``config.compile_threads = 1`` so that every kernel loads in this process.
# * Loads never wait. Inductor autotunes a kernel at its first run, after the whole graph
#   has compiled, so a load that waited for a peer's claim would stall this rank's compile
#   until the peer ran its graph, and two ranks holding each other's claims would both
#   stall for the whole lease. The claim comes at the first run, around coordinate
#   descent (_sharing_coordesc), where ranks split the kernels between them. Other saves
#   claim and publish at once; the first publish of a key wins (entries are immutable).
# * Inductor's remote key hashes the kernel source, and the source embeds
#   ``DeviceProperties(type='cuda', index=N, ...)``: rank N's key would differ from rank
#   M's for the same kernel. ``AutotuneCache.create`` is wrapped to re-key our remote
#   cache with the source hashed without the device index and without the kernel's
#   per-graph number (triton_poi_fused_add_3), which shifts when fusion differs earlier
#   in the graph (seen on 2xH200, torch 2.11: 8 of 13 warm misses before this).
# * Fusion decisions and the split size of a mix-order reduction are decided by timing
#   generated modules with ``TritonScheduling.benchmark_codegened_module`` (2.11-2.14);
#   the split size by ``CoordescTuner.autotune_single_field``, a search whose first round
#   always measures init // 2, init and init * 2, in simd.py's _codegen_mix_order_reduction
#   (on 2xH200 most of the Triton tuning of a llama block). Both are wrapped; Inductor
#   still makes every decision, from the shared timings.
# * 2.11's ``CachingAutotuner._dynamic_scale_rblock`` re-expands a cache hit's reduction
#   config at precompile, so a warm job benchmarked again; 2.13 returns early for a hit
#   (``autotune_cache_info["autotune_cache_state"] == "hit"``), and so do we.

# The lease of the claim a save takes just before it publishes (the two are back to back;
# only a process killed between them leaves the claim, which then expires).
TRITON_LEASE_SECONDS = 60.0
FUSION_KIND = "fusion_benchmark"
# How many values past the one a peer is measuring a split-size search may look for a
# free one to measure meanwhile (:func:`_splitting_single_field`): one is enough for two
# ranks; more ranks measuring the same search find the next ones taken.
SPLIT_STEPS_AHEAD = 4

# Heuristics whose kernels have one fixed config and no coordinate descent
# (triton_heuristics.template / fixed_config, 2.11-2.14): a save of theirs, if any, is
# the only one; there is no coordinate-descent save to hold it back for.
_NO_SAVE_HEURISTICS = ("template", "fixed_config")
_DECORATOR = re.compile(r"@triton_heuristics\.(\w+)\(")
_KERNEL_DEF = re.compile(r"@triton\.jit\s*\ndef (\w+)\(")
# DeviceProperties is a NamedTuple; its repr in the generated source starts
# "DeviceProperties(type='cuda', index=0, " (torch/_inductor/runtime/hints.py, 2.11-2.14).
_DEVICE_INDEX = re.compile(r"(DeviceProperties\(type='([^']*)', )index=\d+")
# The benchmark harness Inductor appends to a kernel module it benchmarks (fusion
# decisions, config.benchmark_kernel; codegen_kernel_benchmark in codegen/triton.py,
# 2.11-2.14) names the device index too: rand_strided(..., device='cuda:1'),
# _DeviceGuard(1), set_device(1), stream1 = get_raw_stream(1). Seen on 2xH200: without
# this the two ranks' fusion benchmark kernels had different keys, so neither reused the
# other's tuning (43 keys, 32 of them in pairs).
_HARNESS_DEVICE_INDEX = (
    (re.compile(r"(device='\w+):\d+'"), r"\1:N'"),
    (re.compile(r"\b(_DeviceGuard|set_device|get_raw_stream)\(\d+\)"), r"\1(N)"),
    (re.compile(r"\bstream\d+\b"), "streamN"),
)


@dataclasses.dataclass
class TritonStats(_Counters):
    """What the Triton autotune cache did in this process (:data:`triton_stats`).

    ``lookups`` are Inductor's reads (one per loaded kernel that autotunes and missed its
    local cache); with parallel compile they happen in the compile workers and are not
    counted here. ``puts`` are Inductor's saves, one or two per kernel tuned in this
    process (always counted here): a warm job has none.
    """

    lookups: int = 0
    hits: int = 0  # a stored, valid best config was returned: the kernel is not tuned
    misses: int = 0  # nothing stored (or a failed key): Inductor tunes the kernel
    invalid: int = 0  # stored entries refused by validation: Inductor tunes the kernel
    puts: int = 0  # results Inductor saved
    published: int = 0  # results stored in the shared cache
    unpublished: int = 0  # not stored: done already, a peer publishing it, store down
    coordesc_restored: int = 0  # stored result already the launcher's (a worker hit)
    adopted: int = 0  # stored result (usually a peer's) compiled and run instead of tuning
    deferred: int = 0  # kernels launched untuned while a peer tuned them
    peer_wait_seconds: float = 0.0  # waiting for a peer's result (kernel or fusion timing)
    kept_untuned: int = 0  # deferred kernels whose later run a CUDA graph recorded
    configs_benchmark_skipped: int = 0  # autotune_to_one_config left to a peer's result
    fusion_hits: int = 0  # fusion benchmarks answered from the store (not run)
    fusion_measured: int = 0  # fusion benchmarks run here
    fusion_left_to_peer: int = 0  # split-size candidates a peer was measuring: skipped
    split_values_ahead: int = 0  # split sizes measured while a peer measured the one before
    split_values_stopped: int = 0  # of those, stopped once the search no longer wanted them
    fusion_seconds: float = 0.0  # in fusion benchmarks: measuring, reading, waiting
    # Names of the kernels whose saves were the puts (the first 100): what a warm job
    # still tuned, for bench_gpu.py's report.
    saved_kernels: list[str] = dataclasses.field(default_factory=list)
    errors: int = 0  # tunecache failed inside get/put; Inductor went on without it
    wait_seconds: float = 0.0  # spent in lookups
    _lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, repr=False, compare=False
    )

    def _add(self, **counts: float) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def _saved(self, name: str) -> None:
        with self._lock:
            if len(self.saved_kernels) < 100:
                self.saved_kernels.append(name)


triton_stats = TritonStats()


def triton_kernel_info(source: str, inductor_meta: Mapping[str, Any]) -> dict[str, Any]:
    """The rank-independent identity of a generated Triton kernel module.

    ``kernel``: sha256 of the source with the device index and the kernel's name blanked
    (everything else in the source, including its inductor_meta and triton_meta, stays
    in); ``name``: the kernel's name (:func:`triton_key` keeps it without its counter);
    ``device_type``; ``device``: the GPU's capability and SM count, from the source's
    DeviceProperties; ``heuristic``: the ``triton_heuristics`` decorator; ``coordesc``:
    whether coordinate descent is on; ``tag``: ``torch.compiler.config.cache_key_tag``,
    which Inductor's own key has too.
    """
    from torch.compiler import config as compiler_config

    match = _DEVICE_INDEX.search(source)
    device_type = match.group(2) if match else "cuda"
    props = {k: m.group(1) for k in ("cc", "multi_processor_count")
             if (m := re.search(rf"DeviceProperties\([^)]*\b{k}=([^,)]+)", source))}
    normalized = _DEVICE_INDEX.sub(r"\1index=None", source)
    for pattern, blank in _HARNESS_DEVICE_INDEX:
        normalized = pattern.sub(blank, normalized)
    jit = _KERNEL_DEF.search(source)
    name = jit.group(1) if jit else str(inductor_meta.get("kernel_name") or "triton_kernel")
    if jit:
        # The name ends in a per-graph counter (triton_poi_fused_add_3): one more or one
        # less kernel earlier in the graph renumbers identical kernels.
        normalized = re.sub(rf"\b{re.escape(name)}\b", "KERNEL_NAME", normalized)
    heuristic = _DECORATOR.search(source)
    return {
        "kernel": hashlib.sha256(normalized.encode()).hexdigest(),
        "name": name,
        "device_type": "cuda" if device_type == "hip" else device_type,
        "device": f"{device_type} cc={props.get('cc', '?')} sms={props.get('multi_processor_count', '?')}",
        "heuristic": heuristic.group(1) if heuristic else "unknown",
        "coordesc": bool(inductor_meta.get("coordinate_descent_tuning")),
        "tag": str(getattr(compiler_config, "cache_key_tag", "")),
    }


def triton_key(inductor_key: str, info: Mapping[str, Any]) -> dict[str, Any]:
    """The shared-cache key of one Triton kernel's best config.

    ``inductor_key`` is Inductor's remote-cache id for the kernel's config list: a hash of
    torch's source (``torch_key``), Triton's version and backend (``backend_hash``: the
    compiler and the GPU target, no device index) and the candidate configs.

    Compile workers compute this key too (the section's notes), so its environment is
    only what they see exactly as the compiling process does, without touching the GPU:
    versions, and the device as the kernel's source describes it. Inductor settings that
    change a kernel's configs are in its source (inductor_meta) and its configs_hash; the
    settings made in code in the compiling process never reach the workers.
    """
    import torch

    info = dict(info)
    # The kernel's name without its per-graph counter: a label for `tunecache stats`,
    # and part of the hash like every key field, so it must not carry the counter.
    name = re.sub(r"_\d+$", "", str(info.pop("name", None) or "")) or "triton_kernel"
    env = {
        "device": str(info.pop("device", None) or info.get("device_type") or "cuda"),
        "torch": str(torch.__version__),
        "triton": _dist_version("triton", "pytorch-triton", "pytorch-triton-rocm"),
        "cuda": str(torch.version.cuda or "none"),
        "hip": str(getattr(torch.version, "hip", None) or "none"),
    }
    return {
        "kind": "triton_config",
        "op": name,
        "env": env,
        "inductor_key": inductor_key,
        **info,
    }


def fusion_benchmark_key(source: str, n_spills_threshold: Any) -> dict[str, Any]:
    """The shared-cache key of one fusion benchmark: the benchmarked module's source (a
    kernel and its benchmark harness, device index blanked) on this device and versions."""
    key = triton_key("", triton_kernel_info(source, {}))
    del key["inductor_key"], key["coordesc"]
    key["kind"] = FUSION_KIND
    key["n_spills_threshold"] = str(n_spills_threshold)
    return key


def fusion_ms_from_entry(timings: Mapping[str, float]) -> float | None:
    """The timing of a stored fusion benchmark, or None if it is not one we would write."""
    if set(timings) != {"ms"}:
        return None
    return float(timings["ms"])  # validate_timings: finite and >= 0, or inf


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def triton_config_from_entry(timings: Mapping[str, float]) -> dict[str, Any] | None:
    """The best-config dict of a stored entry, or None if it is not one we would write.

    An entry holds exactly one candidate whose name is the canonical JSON of the dict
    ``AutotuneCache.save`` built (without ``time_taken_ms``). A shared database can hold
    anything, so every field Inductor turns into a Triton launch is checked.
    """
    if len(timings) != 1:
        return None
    (name,) = timings
    try:
        value = json.loads(name)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    for field, wanted in (("num_warps", int), ("num_stages", int), ("configs_hash", str)):
        v = value.get(field)
        if isinstance(v, bool) or not isinstance(v, wanted):
            return None
    if not (_is_pow2(value["num_warps"]) and value["num_warps"] <= 64):
        return None
    if not 0 <= value["num_stages"] <= 16:
        return None
    for k, v in value.items():
        if k == "extra_options":
            if v is not None and not isinstance(v, dict):
                return None
        elif k == "found_by_coordesc":
            if not isinstance(v, bool):
                return None
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if k.upper().endswith("BLOCK") and not (_is_pow2(v) and v <= 1 << 20):
                return None
            if abs(v) > 1 << 31:
                return None
        elif isinstance(v, float):
            if not math.isfinite(v):
                return None
        elif isinstance(v, str):
            if len(v) > 256:
                return None
        else:
            return None
    value["time_taken_ms"] = int(timings[name]) if math.isfinite(timings[name]) else 0
    return value


def _coordesc_result(timings: Mapping[str, float]) -> dict[str, Any] | None:
    """:func:`triton_config_from_entry`, where that config is a coordinate-descent result."""
    best = triton_config_from_entry(timings)
    return best if best is not None and best.get("found_by_coordesc") else None


class _TritonCache:
    """get/put of Inductor's remote autotune cache, over the shared TuneCache.

    get (at kernel load, in this process or a compile worker): a stored, valid best config
    -> it; else None, and Inductor tunes the kernel at its first run. It never claims or
    waits (see this section's notes). plan_coordesc (at the first run, before coordinate
    descent): adopt, claim, or defer to a peer. put (at the first run, always in the
    compiling process): publish under plan_coordesc's claim, or claim the key and publish
    at once, unless it is done already. With
    coordinate descent on, Inductor saves twice per kernel (the autotune_to_one_config
    winner, then the coordinate descent result); entries are immutable, so the first is
    held back until the second replaces it, or until this thread moves on to another
    kernel.

    ``cache`` returns the TuneCache to use (opened lazily). ``worker``: this process is a
    compile worker, which only reads; it drops its connection after each read, because
    every rank has up to 32 workers and a PostgreSQL server has ~100 connections.
    """

    def __init__(self, cache: Callable[[], TuneCache], *, worker: bool = False) -> None:
        self.cache = cache
        self.worker = worker
        self._lock = threading.Lock()
        self._held: dict[str, tuple[int, dict[str, Any], dict[str, Any]]] = {}
        self._claims: dict[str, Any] = {}  # key hash -> Claim, from plan_coordesc to put
        # thread -> key hash of a claim plan_coordesc(ahead=True) took for the coordinate
        # descent that follows on that thread
        self._claimed_ahead: dict[int, str] = {}
        self._unpublished: set[str] = set()  # plan_coordesc's claims whose publish failed
        self._warned: set[str] = set()

    @staticmethod
    def _info(key_text: str) -> dict[str, Any]:
        try:
            info = json.loads(key_text)
        except ValueError:
            info = None
        if not isinstance(info, dict) or "kernel" not in info:
            # Inductor's own key (the re-keying wrapper did not run): correct, but it
            # hashes the device index, so ranks on other GPUs do not share it.
            info = {"kernel": key_text}
        return info

    def _key(self, inductor_key: str, key_text: str) -> tuple[dict[str, Any], dict[str, Any], str]:
        """(info, key, key hash) of the kernel Inductor names by these two strings."""
        info = self._info(key_text)
        key = triton_key(inductor_key, info)
        return info, key, tc_keys.key_hash(key)[0]

    def _stored_best(self, key: Mapping[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """(found, best config): whether a done entry is stored, and its config if valid."""
        cache = self.cache()
        try:
            answer = cache.lookup(key)
        finally:
            if self.worker:
                cache.store.db.dispose()
        if answer is None or answer.source == "failed":
            return False, None
        return True, triton_config_from_entry(answer.timings)

    def _warn_once(self, what: str, error: BaseException) -> None:
        triton_stats._add(errors=1)
        with self._lock:
            first = what not in self._warned
            self._warned.add(what)
        if first:
            log.warning(
                "tunecache: %s failed (%s: %s); Inductor autotunes that Triton kernel as "
                "usual (further failures are logged at debug level)",
                what, type(error).__name__, error,
            )
        else:
            log.debug("tunecache: %s failed again: %r", what, error)

    # -- Inductor's calls

    def get(self, inductor_key: str, key_text: str) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        triton_stats._add(lookups=1)
        try:
            self.flush(threading.get_ident())
            return self._get(inductor_key, key_text)
        except Exception as e:  # noqa: BLE001 - an error here would fail the kernel load
            self._warn_once("reading a Triton kernel's best config", e)
            return None
        finally:
            triton_stats._add(wait_seconds=time.perf_counter() - t0)

    def put(self, inductor_key: str, key_text: str, value: Any) -> None:
        triton_stats._add(puts=1)
        try:
            self._put(inductor_key, key_text, value)
        except Exception as e:  # noqa: BLE001 - an error here would fail the kernel run
            self._warn_once("publishing a Triton kernel's best config", e)

    def flush(self, thread: int | None = None) -> None:
        """Publish held results (of one thread, or all)."""
        with self._lock:
            ready = [h for h, (t, _, _) in self._held.items() if thread is None or t == thread]
            items = [self._held.pop(h) for h in ready]
        for _, key, value in items:
            try:
                self._publish(key, value)
            except Exception as e:  # noqa: BLE001 - see put()
                self._warn_once("publishing a Triton kernel's best config", e)

    # -- the protocol

    def _get(self, inductor_key: str, key_text: str) -> dict[str, Any] | None:
        info, key, key_hash = self._key(inductor_key, key_text)
        found, best = self._stored_best(key)
        if not found:
            triton_stats._add(misses=1)
            return None
        if best is None:
            triton_stats._add(invalid=1)
            if key_hash not in self._warned:
                self._warned.add(key_hash)
                log.warning("tunecache: the stored Triton config of %s (%s) is not valid; "
                            "Inductor tunes it here", info.get("name", "?"), key_hash[:16])
            return None
        triton_stats._add(hits=1)
        return best

    def plan_coordesc(
        self, inductor_key: str, key_text: str, *, waits: bool, ahead: bool = False
    ) -> tuple[str, dict[str, Any] | None]:
        """What a kernel's run does instead of, or around, coordinate descent.

        ``("adopt", best)``: the store has the coordinate-descent result; run it.
        ``("tune", None)``: this process claimed the key; tune and publish it.
        ``("defer", None)``: a peer is tuning it; launch it untuned and ask again at a
        later run. ``("local", None)``: tune here without the cache (store down,
        readonly, a failed or invalid entry, or a peer's result that never came).
        ``waits``: wait for a peer's result rather than defer (a kernel that cannot be
        deferred, or one whose timing decides a benchmark). ``ahead``: asked before
        autotune_to_one_config's benchmark, which only the tuning rank needs: a claim
        taken then is this thread's for the coordinate descent that follows, so a peer
        at the same kernel at the same moment skips that benchmark too. Should another
        kernel be planned on this thread first (a caller that tunes no further), the
        claim is given back then.
        """
        _, key, key_hash = self._key(inductor_key, key_text)
        thread = threading.get_ident()
        with self._lock:
            # The autotune_to_one_config save held for this key: coordinate descent
            # decides now, and its result (ours or a peer's) is the one that counts.
            self._held.pop(key_hash, None)
            early = self._claimed_ahead.pop(thread, None)
            if early == key_hash and key_hash in self._claims:
                return "tune", None
        if early is not None and early != key_hash:
            self._release(early, "no coordinate descent followed its configs' benchmark",
                          failed=False)
        state, value = self._claim_step(key, waits, _coordesc_result)
        if state == "claimed":
            with self._lock:
                self._claims[key_hash] = value
                if ahead:
                    self._claimed_ahead[thread] = key_hash
            return "tune", None
        return {"done": "adopt", "busy": "defer"}.get(state, "local"), value

    def _claim_step(
        self, key: Mapping[str, Any], waits: bool, read: Callable[[Mapping[str, float]], Any],
        *, again: bool = True,
    ) -> tuple[str, Any]:
        """Where ``key`` stands, claiming it if it is free: ``("done", read(timings))``
        for a stored entry that ``read`` accepts (not None); ``("claimed", claim)``: this
        process is to measure and publish it; ``("busy", None)``: a peer holds it (only
        when not ``waits``, else this waits out the peer's claim, one lease at most);
        ``("local", None)``: measure without sharing (store down or readonly, a failed or
        refused entry, or a peer's result that never came). ``again``: look once more
        if the peer's claim that the claim found is gone by the time it is checked."""
        from .core import Result

        cache = self.cache()
        answer: Any = cache.lookup(key)
        if answer is None:
            t0 = time.perf_counter()
            answer = cache.claim(key, lease_seconds=TRITON_LEASE_SECONDS,
                                 wait=TRITON_LEASE_SECONDS + 5.0 if waits else 0.0)
            if waits:
                triton_stats._add(peer_wait_seconds=time.perf_counter() - t0)
        if isinstance(answer, Result):
            value = None if answer.source == "failed" else read(answer.timings)
            return ("local", None) if value is None else ("done", value)
        if answer is not None:
            return "claimed", answer
        if waits:
            return "local", None
        if cache.in_progress(key):
            return "busy", None
        if again:
            # The claim found a peer's claim, which has ended since: ranks in step reach a
            # kernel just as the peer that claimed it publishes it. Look again rather than
            # measure what the peer has just published (issue 13, a flaky two-process test).
            return self._claim_step(key, waits, read, again=False)
        return "local", None

    def release_claim(self, inductor_key: str, key_text: str,
                      error: BaseException | str) -> None:
        """Give back this process's claim on a kernel if it was not published.
        ``error``: what stopped the tuning (:func:`_released_as`)."""
        try:
            text, failed = _released_as(error)
            self._release(self._key(inductor_key, key_text)[2], text, failed=failed)
        except Exception as e:  # noqa: BLE001 - called on Inductor's paths, even its errors'
            self._warn_once("giving back a Triton kernel's claim", e)

    def _release(self, key_hash: str, error: str, *, failed: bool = True) -> None:
        with self._lock:
            claim = self._claims.pop(key_hash, None)
            for thread, held in list(self._claimed_ahead.items()):
                if held == key_hash:
                    del self._claimed_ahead[thread]
        if claim is not None:
            self.cache().release(claim, error, failed=failed)

    def _put(self, inductor_key: str, key_text: str, value: Any) -> None:
        if not isinstance(value, dict):
            return
        info, key, key_hash = self._key(inductor_key, key_text)
        triton_stats._saved(str(key["op"]))
        thread = threading.get_ident()
        # With coordinate descent on, autotune_to_one_config saves first (it passes the
        # winner's triton_cache_hash), then coordinate descent saves the final config
        # (without one). Hold the first: the second replaces it.
        first_of_two = (
            info.get("coordesc")
            and info.get("heuristic") not in _NO_SAVE_HEURISTICS + ("user_autotune",)
            and value.get("triton_cache_hash") is not None
        )
        with self._lock:
            self._held.pop(key_hash, None)  # a second save replaces a held first one
        self.flush(thread)  # this thread has moved on from any other kernel it held
        if first_of_two:
            with self._lock:
                self._held[key_hash] = (thread, key, dict(value))
            return
        self._publish(key, value)

    def _publish(self, key: dict[str, Any], value: Mapping[str, Any]) -> None:
        from .core import Result

        key_hash, _ = tc_keys.key_hash(key)
        entry = {k: v for k, v in value.items() if k != "time_taken_ms"}
        ms = _ms(value.get("time_taken_ms", 0))
        timings = {tc_keys.canonical_json(entry): 0.0 if ms == math.inf else ms}
        if triton_config_from_entry(timings) is None:
            log.debug("tunecache: not publishing an unexpected Triton config %r", entry)
            triton_stats._add(unpublished=1)
            return
        cache = self.cache()
        with self._lock:
            claim: Any = self._claims.pop(key_hash, None)  # taken by plan_coordesc
        planned = claim is not None
        if claim is None:
            claim = cache.claim(key, lease_seconds=TRITON_LEASE_SECONDS, wait=0.0)
        if claim is None or isinstance(claim, Result):
            # Done already (a peer published first, or this is a hit saved again), a
            # peer is publishing it right now, or the store is unavailable or readonly.
            triton_stats._add(unpublished=1)
            return
        stored = cache.publish(claim, timings, tune_seconds=timings[next(iter(timings))] / 1000)
        triton_stats._add(**{"published" if stored is not None else "unpublished": 1})
        if planned and stored is None:
            with self._lock:
                self._unpublished.add(key_hash)

    def fusion_timing(self, key: Mapping[str, Any], *, waits: bool) -> tuple[str, Any]:
        """Where a fusion benchmark stands (:meth:`_claim_step`): ``("done", ms)``: decide
        on the stored timing, do not run it; ``("claimed", claim)``: run it here and
        :meth:`publish_fusion_ms`; ``"busy"`` or ``"local"``: see there."""
        return self._claim_step(key, waits, fusion_ms_from_entry)

    def publish_fusion_ms(self, key: Mapping[str, Any], claim: Any, ms: float) -> float:
        """Publish a fusion benchmark measured under ``claim``; return the timing every
        rank decides on: ``ms``, or the stored one where this process lost its claim
        (it stalled past the lease and a peer measured the module meanwhile)."""
        if self.cache().publish(claim, {"ms": ms}, tune_seconds=0.0) is not None:
            return ms
        answer = self.cache().lookup(key)
        stored = None if answer is None else fusion_ms_from_entry(answer.timings)
        return ms if stored is None else stored

    def stored_instead(self, inductor_key: str, key_text: str) -> dict[str, Any] | None:
        """After this process tuned a kernel under a claim it then failed to publish (it
        stalled past the lease and a peer took the key over): the stored config, which
        every other rank runs. None if the publish went through or nothing valid is stored.
        """
        _, key, key_hash = self._key(inductor_key, key_text)
        with self._lock:
            if key_hash not in self._unpublished:
                return None
            self._unpublished.discard(key_hash)
        answer = self.cache().lookup(key)
        return None if answer is None or answer.source == "failed" \
            else _coordesc_result(answer.timings)


_TRITON: _TritonCache | None = None
_TRITON_PATCH: _TritonPatch | None = None  # set when the state came from the environment
_triton_atexit = False


@functools.lru_cache(maxsize=None)
def _remote_cache_class() -> type:
    """Our ``RemoteAutotuneCache``: Inductor's RemoteCache over a tunecache backend."""
    from torch._inductor import remote_cache as rc

    serde_cls = getattr(rc, "RemoteCachePassthroughSerde", None)

    class TuneCacheAutotuneBackend(rc.RemoteCacheBackend):  # type: ignore[misc, valid-type]
        def __init__(self, cache_id: str) -> None:
            super().__init__()
            self.cache_id = cache_id

        def _get(self, key: str) -> Any:
            state = _TRITON
            return None if state is None else state.get(self.cache_id, key)

        def _put(self, key: str, data: Any) -> None:
            state = _TRITON
            if state is not None:
                state.put(self.cache_id, key, data)

    class TuneCacheAutotuneCache(rc.RemoteCache):  # type: ignore[misc, valid-type]
        """Inductor's remote autotune cache, backed by tunecache (tunecache.inductor)."""

        def __init__(self, cache_id: str) -> None:
            super().__init__(TuneCacheAutotuneBackend(cache_id), serde_cls())

    return TuneCacheAutotuneCache


def _shared_kernel(kernel: Any, ours: type) -> tuple[str, str] | None:
    """(Inductor's key, our key text) of a kernel whose autotune cache is ours, else None."""
    autotune_cache = getattr(getattr(kernel, "save_cache_hook", None), "__self__", None)
    remote = getattr(autotune_cache, "remote_cache", None)
    if remote and isinstance(remote, tuple) and isinstance(remote[0], ours):
        return autotune_cache.remote_cache_full_key, remote[1]
    return None


def _coordesc_tunes(kernel: Any) -> bool:
    """Whether Inductor's coordinate descent would tune (and save) this kernel.

    2.13+ asks ``_should_coordesc_tune``; 2.11 returns early for template, user and
    fixed-config kernels, and those are the heuristics that property also excludes.
    """
    should = getattr(type(kernel), "_should_coordesc_tune", None)
    if isinstance(should, property):
        return bool(kernel._should_coordesc_tune)
    kind = getattr(getattr(kernel, "heuristic_type", None), "name", "")
    if kind in ("TEMPLATE", "USER_AUTOTUNE", "FIXED"):
        return False
    # 2.11 also leaves reductions alone in deterministic mode (their numerics).
    return not (getattr(kernel, "deterministic_mode", False)
                and kind in ("REDUCTION", "PERSISTENT_REDUCTION", "SPLIT_SCAN"))


def _can_defer(kernel: Any) -> bool:
    """Whether this kernel may run untuned and adopt a peer's config at a later run.

    run() calls coordinate descent again at every launch while the launcher's config is
    not ``found_by_coordesc``, except that 2.13+ then caches the launcher for a fast path
    after the first launch; with it off (``_cache_eligible``) later launches take the
    slow path again. A torch with a fast path we do not know could keep the untuned
    config for good: no deferral there. Nor under CUDA graph trees: they record a
    function's second call, so a later launch would be recorded before the peer's
    config could be compiled (which is not safe while capturing) and the graph would
    replay the untuned config for good.
    """
    if hasattr(kernel, "_cached_launcher") and not hasattr(kernel, "_cache_eligible"):
        return False
    return not _cuda_graph_trees_in_use(kernel)


def _cuda_graph_trees_in_use(kernel: Any) -> bool:
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return False
    try:
        index = int(kernel.triton_meta["device"])
        return trees.get_manager(index, create_if_none_exists=False) is not None
    except Exception:  # noqa: BLE001 - unknown: assume they are, and do not defer
        return True


# On a deferred kernel: (its own ``_cache_eligible`` (None where there is none), to put
# back; when to look for the peer's result next).
_DEFERRED = "_tunecache_deferred"
# How often a deferred kernel's runs look for the peer's result: a kernel can run
# thousands of times a second, and each look reads the database.
DEFERRED_CHECK_SECONDS = 0.1


def _capturing() -> bool:
    """Whether this thread's current CUDA stream is capturing a CUDA graph."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def _same_config(a: Any, b: Any) -> bool:
    return (a.num_warps, a.num_stages, dict(a.kwargs)) == (b.num_warps, b.num_stages, dict(b.kwargs))


def _adopt(kernel: Any, launcher: Any, best: dict[str, Any]) -> Any:
    """The launcher of the stored coordinate-descent config ``best`` of ``kernel``."""
    from torch._inductor.runtime import autotune_cache as ac

    autotune_cache = kernel.save_cache_hook.__self__
    # Inductor's own reading of a saved best config (the one a kernel load uses).
    config = ac._load_cached_autotuning(
        dict(best), autotune_cache.configs_hash, kernel.configs, kernel.inductor_meta
    )
    if config is None:
        raise ValueError("the stored config is not one of this kernel's")
    if _same_config(config, launcher.config):
        launcher.config.found_by_coordesc = True
        triton_stats._add(coordesc_restored=1)
        return launcher
    ensure_loaded = getattr(kernel, "_ensure_kernel_loaded", None)
    if ensure_loaded is not None:
        ensure_loaded()
    elif kernel.fn.fn is None:  # 2.11: what its coordinate descent does first
        kernel.fn = kernel._reload_kernel().fn
    with kernel.lock:  # as Inductor's coordinate descent compiles a config
        adopted = kernel._precompile_config(config).make_launcher()
    adopted.config.found_by_coordesc = True
    try:
        from torch._inductor.triton_bundler import TritonBundler

        if hasattr(TritonBundler, "put_winner"):  # 2.13+: the FX cache bundles winners
            TritonBundler.put_winner(adopted.cache_hash)
    except ImportError:
        pass
    triton_stats._add(adopted=1)
    return adopted


def _sharing_coordesc(orig: Callable[..., Any], ours: type) -> Callable[..., Any]:
    """``CachingAutotuner.coordinate_descent_tuning`` through the shared cache.

    Inductor calls it at a kernel's first run (and at every run while the launcher's
    config is not ``found_by_coordesc``). Ranks run the same kernels in the same order,
    so a claim-or-wait here would only make one rank idle while the other tunes. Instead
    (:meth:`_TritonCache.plan_coordesc`): a stored result is adopted; a free key is
    claimed and tuned here; a key a peer is tuning is launched with the config
    autotune_to_one_config chose, and keeps running it, while this rank goes on to the
    next kernels, until a later run finds the peer's result and adopts it. The ranks
    thus take turns along the graph and each tunes about half of its kernels, and once
    the results are in every rank runs the same configs. Inside a fusion benchmark the
    config decides a timing, so there the rank waits for the peer instead.

    It also covers hits read in compile workers: their ``found_by_coordesc`` mark does
    not survive the trip back (triton.Config.__setstate__ restores only its own fields,
    triton 3.x), so without this their first run would tune again.
    """

    def coordinate_descent_tuning(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        state = _TRITON
        # Run at every launch of a kernel coordinate descent leaves alone (templates): the
        # cheapest test first.
        if state is None or not _coordesc_tunes(self):
            return orig(self, launcher, *args, **kwargs)
        kernel = _shared_kernel(self, ours)
        if kernel is None:
            return orig(self, launcher, *args, **kwargs)
        deferred = self.__dict__.get(_DEFERRED)
        if deferred is not None:
            if _capturing():
                # CUDA graphs record this launch (cudagraph trees record a function's
                # second call): compiling the peer's config now is not safe, and the
                # recorded graph would replay whatever runs. Keep the first config.
                _end_deferral(self)
                launcher.config.found_by_coordesc = True
                triton_stats._add(kept_untuned=1)
                return launcher
            if time.monotonic() < deferred[1]:
                return launcher
        waits = getattr(_fusion_local, "benchmarking", False) or not _can_defer(self)
        try:
            action, best = state.plan_coordesc(*kernel, waits=waits)
            if action == "adopt":
                _end_deferral(self)
                return _adopt(self, launcher, best or {})
        except Exception as e:  # noqa: BLE001 - coordinate descent runs as usual
            state._warn_once("sharing a Triton kernel's coordinate descent", e)
            state.release_claim(*kernel, e)
            _end_deferral(self)
            return orig(self, launcher, *args, **kwargs)
        if action == "defer":
            if deferred is None:
                triton_stats._add(deferred=1)
                deferred = (getattr(self, "_cache_eligible", None),)
                if hasattr(self, "_cache_eligible"):
                    self._cache_eligible = False
            setattr(self, _DEFERRED, (deferred[0], time.monotonic() + DEFERRED_CHECK_SECONDS))
            return launcher
        _end_deferral(self)
        # Normally the save inside publishes it; if not (it raised, or saved nothing),
        # the key is given back now rather than make peers wait out the lease.
        try:
            winner = orig(self, launcher, *args, **kwargs)
        except BaseException as e:
            state.release_claim(*kernel, e)
            raise
        state.release_claim(*kernel, "coordinate descent published no result")
        try:
            stored = state.stored_instead(*kernel)
            if stored is not None:  # a peer's result won: run it, as every rank does
                return _adopt(self, winner, stored)
        except Exception as e:  # noqa: BLE001 - our own result still runs correctly
            state._warn_once("adopting the stored config of a Triton kernel tuned here", e)
        return winner

    return coordinate_descent_tuning


def _sharing_one_config(orig: Callable[..., Any], ours: type) -> Callable[..., Any]:
    """``CachingAutotuner.autotune_to_one_config`` that benchmarks a kernel's configs only
    on the rank that will tune its coordinate descent.

    Inductor benchmarks a kernel's max-autotune configs at its first run and starts
    coordinate descent from the fastest. So the kernel's coordinate descent is planned
    here, before that benchmark (:meth:`_TritonCache.plan_coordesc`, ``ahead``): a
    free key is claimed and the benchmark runs. Where the result will be a peer's (stored,
    or a peer holds the claim), the benchmark would only pick the config the kernel runs
    until the result is adopted; so it is skipped and the kernel's first config picked.
    Inductor's own method still runs around that pick (2.13+ prunes launchers and bundles
    the winner there): only its ``benchmark_all_configs`` is answered, on this instance
    and for this call. Should the peer die and this rank take the kernel over,
    coordinate descent starts from that first config.
    """

    def autotune_to_one_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = _TRITON
        if (state is None or not _coordesc_tunes(self)
                or not self.inductor_meta.get("coordinate_descent_tuning")):
            return orig(self, *args, **kwargs)
        kernel = _shared_kernel(self, ours)
        try:
            action = "local" if kernel is None else \
                state.plan_coordesc(*kernel, waits=False, ahead=True)[0]
        except Exception as e:  # noqa: BLE001 - Inductor benchmarks as usual
            state._warn_once("sharing a Triton kernel's coordinate descent", e)
            action = "local"
        if action in ("tune", "local"):
            try:
                return orig(self, *args, **kwargs)
            except BaseException as e:
                if kernel is not None:
                    state.release_claim(*kernel, e)
                raise
        first = self.launchers[0]
        self.benchmark_all_configs = lambda *_a, **_k: {
            launcher: 0.0 if launcher is first else 1.0 for launcher in self.launchers
        }
        try:
            result = orig(self, *args, **kwargs)
        finally:
            self.__dict__.pop("benchmark_all_configs", None)
        triton_stats._add(configs_benchmark_skipped=1)
        return result

    return autotune_to_one_config


def _end_deferral(kernel: Any) -> None:
    """Put back what deferring ``kernel`` held off (2.13+'s launcher fast path)."""
    deferred = kernel.__dict__.pop(_DEFERRED, None)
    if deferred is not None and deferred[0] is not None:
        kernel._cache_eligible = deferred[0]


# What _install_runtime_hooks replaced: (owner, attribute, its own value in __dict__);
# _runtime_hooks_tried: whether this enable has tried to install them (once: see create()).
_RUNTIME_HOOKS: list[tuple[type, str, Any]] = []
_runtime_hooks_tried = False
_runtime_hooks_lock = threading.Lock()  # kernels may load on several threads at once


def _ensure_runtime_hooks(ours: type) -> None:
    """Install the runtime hooks (:func:`_install_runtime_hooks`) once
    CachingAutotuner exists.

    Triton sharing can be enabled inside the import of triton_heuristics itself (it
    imports autotune_cache, whose import the autoload hook watches), before the class
    exists; then this waits for the first kernel load in this process (create()), which
    runs triton_heuristics code. Usually the class exists at enable() already (the GEMM
    hooks are enabled after select_algorithm, which imports it), and it must be there
    by then: with parallel compile the first in-process kernel load can come after the
    forward graph's first run, whose kernels would otherwise all be tuned on every rank
    (seen on 2xH200). Compile workers never need them (no runs, no benchmarks).
    """
    global _runtime_hooks_tried
    state = _TRITON
    if state is None or state.worker or _runtime_hooks_tried:
        return
    th = sys.modules.get("torch._inductor.runtime.triton_heuristics")
    if getattr(th, "CachingAutotuner", None) is None:
        return
    with _runtime_hooks_lock:
        if _runtime_hooks_tried:
            return
        _runtime_hooks_tried = True
        _install_runtime_hooks(th.CachingAutotuner, ours, state)


def _install_runtime_hooks(cls: type, ours: type, state: _TritonCache) -> None:
    """Wrap, each on its own (one that fails leaves the others in place):
    ``CachingAutotuner.coordinate_descent_tuning`` (:func:`_sharing_coordesc`),
    ``CachingAutotuner.autotune_to_one_config`` (:func:`_sharing_one_config`),
    ``CachingAutotuner._dynamic_scale_rblock`` (:func:`_keeping_hit_configs`) and
    ``CoordescTuner.autotune_single_field`` (:func:`_splitting_single_field`, with
    ``CoordescTuner.call_func``: :func:`_stopping_unwanted`)."""

    def coordesc() -> None:
        orig = cls.__dict__.get("coordinate_descent_tuning")
        if not callable(orig) or _param_names(orig)[:1] != ("launcher",):
            raise TypeError("CachingAutotuner.coordinate_descent_tuning(launcher, ...) changed")
        _replace(cls, "coordinate_descent_tuning", _sharing_coordesc(orig, ours))

    def one_config() -> None:
        orig = cls.__dict__.get("autotune_to_one_config")
        if not callable(orig) or "benchmark_all_configs" not in cls.__dict__:
            raise TypeError("CachingAutotuner.autotune_to_one_config changed")
        _replace(cls, "autotune_to_one_config", _sharing_one_config(orig, ours))

    def rblock() -> None:
        orig = cls.__dict__.get("_dynamic_scale_rblock")
        if not callable(orig) or _param_names(orig) != ():
            raise TypeError("CachingAutotuner._dynamic_scale_rblock() changed")
        _replace(cls, "_dynamic_scale_rblock", _keeping_hit_configs(orig))

    def single_field() -> None:
        from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

        orig = CoordescTuner.__dict__.get("autotune_single_field")
        if not isinstance(orig, staticmethod) or _param_names(orig.__func__) != (
            "fn", "init_val", "min_val", "max_val"
        ):
            raise TypeError("CoordescTuner.autotune_single_field(fn, init_val, ...) changed")
        _replace(CoordescTuner, "autotune_single_field",
                 staticmethod(_splitting_single_field(orig.__func__)))
        orig = CoordescTuner.__dict__.get("call_func")
        if not callable(orig) or _param_names(orig) != ("func", "config"):
            raise TypeError("CoordescTuner.call_func(func, config) changed")
        _replace(CoordescTuner, "call_func", _stopping_unwanted(orig))

    for what, install in (("sharing coordinate descent", coordesc),
                          ("leaving a peer's kernels unbenchmarked", one_config),
                          ("keeping stored reduction configs", rblock),
                          ("splitting the split-size search", single_field)):
        try:
            install()
        except Exception as e:  # noqa: BLE001 - that part runs as Inductor's own
            state._warn_once(what, e)


def _replace(owner: type, name: str, value: Any) -> None:
    _RUNTIME_HOOKS.append((owner, name, owner.__dict__[name]))
    setattr(owner, name, value)


def _remove_runtime_hooks() -> None:
    global _runtime_hooks_tried
    _runtime_hooks_tried = False
    while _RUNTIME_HOOKS:
        owner, name, orig = _RUNTIME_HOOKS.pop()
        setattr(owner, name, orig)


def _rekey_create(orig: Callable[..., Any], ours: type) -> Callable[..., Any]:
    """``AutotuneCache.create``, re-keying our remote cache without the device index."""

    def create(inductor_meta: Any, filename: str, configs_hash: str) -> Any:
        if not _runtime_hooks_tried:
            _ensure_runtime_hooks(ours)
        cache = orig(inductor_meta, filename, configs_hash)
        remote = getattr(cache, "remote_cache", None)
        if remote and isinstance(remote, tuple) and isinstance(remote[0], ours):
            try:
                with open(filename, encoding="utf-8") as f:
                    source = f.read()
                info = triton_kernel_info(source, inductor_meta or {})
                cache.remote_cache = (remote[0], tc_keys.canonical_json(info))
            except Exception as e:  # noqa: BLE001 - Inductor's own key still works
                if _TRITON is not None:
                    _TRITON._warn_once("keying a Triton kernel without its device index", e)
        return cache

    return create


class _PeerMeasuring(Exception):
    """A peer is running this fusion benchmark: raised to :func:`_splitting_single_field`,
    which leaves that candidate to the peer and comes back to it later."""


class _NoLongerWanted(BaseException):
    """Stops a split-size value measured ahead once the search is known not to ask for it
    (:func:`_splitting_single_field`). A BaseException: Inductor turns an Exception
    inside a benchmarked module, or a coordinate-descent step, into an inf timing."""


def _released_as(error: BaseException | str) -> tuple[str, bool]:
    """(error text, whether the attempt failed) for giving back a claim because of
    ``error``: a measurement stopped as no longer wanted is not a failed attempt (a key
    with too many of those would end ``failed``, and every rank then measures it alone)."""
    if isinstance(error, str):
        return error, True
    return f"{type(error).__name__}: {error}", not isinstance(error, _NoLongerWanted)


def _stop_unless_wanted() -> None:
    wanted = getattr(_fusion_local, "wanted", None)
    if wanted is not None and not wanted():
        raise _NoLongerWanted


# Per thread: .prefetching (in _splitting_single_field: a benchmark a peer is running
# raises _PeerMeasuring instead of waiting, and sets .left_to_peer to its key), .wanted
# (measuring a split-size value ahead: whether the search may still ask for it) and
# .benchmarking (inside a fusion benchmark: a kernel's config decides the timing, so its
# coordinate descent waits for a peer instead of deferring).
_fusion_local = threading.local()


def _sharing_fusion_benchmark(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``TritonScheduling.benchmark_codegened_module`` through the shared cache.

    Inductor decides a benchmarked fusion (epilogue fusion into a GEMM template under
    max-autotune, ``config.benchmark_fusion``) and the split size of a mix-order
    reduction by timing candidate kernel modules here; ``benchmark_fused_nodes``
    generates a module and calls it too (2.11-2.14). Inductor keeps each timing in a
    node-local file beside the module (``.kernel_perf``), so every new node measures
    again, and ranks measure separately and can decide differently. Here a benchmark is
    a key like any other: a stored timing is returned without running the module (its
    kernel is then neither run nor tuned); a free one is claimed, run and published; one
    a peer is running is waited for. So each module is measured once per cluster and
    every rank decides on the same timing. The decision itself stays Inductor's.
    """

    def benchmark_codegened_module(self: Any, mod: Any, *args: Any, **kwargs: Any) -> Any:
        state = _TRITON
        if state is None:
            return orig(self, mod, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            return shared_benchmark(state, self, mod, *args, **kwargs)
        finally:
            triton_stats._add(fusion_seconds=time.perf_counter() - t0)

    def shared_benchmark(state: _TritonCache, self: Any, mod: Any, *args: Any,
                         **kwargs: Any) -> Any:
        prefetching = getattr(_fusion_local, "prefetching", False)
        _stop_unless_wanted()
        try:
            threshold = kwargs.get("n_spills_threshold", args[0] if args else "default")
            with open(mod.__file__, encoding="utf-8") as f:
                key = fusion_benchmark_key(f.read(), threshold)
            action, value = state.fusion_timing(key, waits=not prefetching)
        except Exception as e:  # noqa: BLE001 - Inductor benchmarks it as usual
            state._warn_once("reading a fusion benchmark's timing", e)
            action, value = "local", None
        if action == "done":
            triton_stats._add(fusion_hits=1)
            return value, mod.__file__
        if action == "busy":
            _fusion_local.left_to_peer = key
            raise _PeerMeasuring
        outer = getattr(_fusion_local, "benchmarking", False)
        _fusion_local.benchmarking = True
        try:
            result = orig(self, mod, *args, **kwargs)
        except BaseException as e:
            if action == "claimed":
                error, failed = _released_as(e)
                state.cache().release(value, error, failed=failed)
            raise
        finally:
            _fusion_local.benchmarking = outer
        triton_stats._add(fusion_measured=1)
        if action != "claimed":
            return result
        try:
            # Inductor subtracts the cost of cloning mutated inputs, which can come out
            # below zero; the store holds timings >= 0, and every rank must decide on
            # the one stored, this one included.
            measured = max(0.0, float(result[0]))
            shared = state.publish_fusion_ms(key, value, measured)
            return (shared, *result[1:])
        except Exception as e:  # noqa: BLE001 - our own measurement still decides
            state._warn_once("publishing a fusion benchmark's timing", e)
            state.cache().release(value, f"{type(e).__name__}: {e}")
            return result

    return benchmark_codegened_module


def _splitting_single_field(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CoordescTuner.autotune_single_field`` split across ranks.

    Inductor searches a mix-order reduction's split size with it (2.11-2.14, under
    max-autotune): each candidate value is a kernel module generated, tuned (coordinate
    descent) and benchmarked through ``benchmark_codegened_module``, one after another.
    Its first round always measures ``init // 2``, ``init`` and ``init * 2`` (clamped):
    those are measured first here, skipping any a peer is measuring (each rank takes the
    next free one). Then Inductor's own search runs over the timings, reading the peers'
    from the store. Each later round measures one new value ``v``, a step further from
    ``init`` than the best so far ``p``, and goes on to the next step only if ``v`` beats
    ``p``, so the rounds are a chain. Where a peer is measuring ``v``, this rank measures
    the next step meanwhile (:data:`SPLIT_STEPS_AHEAD`), and stops that measurement (at
    its next coordinate-descent benchmark) once ``v``'s timing is in and does not beat
    ``p``'s. The timings, hence the result, are the ones every rank reads.
    """

    def autotune_single_field(fn: Callable[[Any], Any], init_val: Any,
                              min_val: Any = None, max_val: Any = None) -> Any:
        if _TRITON is None or getattr(_fusion_local, "prefetching", False):
            return orig(fn, init_val, min_val, max_val)
        search = _SplitSizeSearch(fn, init_val, min_val, max_val)
        search.first_round()
        return orig(search.timing, init_val, min_val, max_val)

    return autotune_single_field


class _SplitSizeSearch:
    """The timings one split-size search runs on (:func:`_splitting_single_field`):
    ``fn`` measures a value (a fusion benchmark, through the shared cache)."""

    def __init__(self, fn: Callable[[Any], Any], init_val: Any, min_val: Any,
                 max_val: Any) -> None:
        self.fn = fn
        self.init = init_val
        self.low = 1 if min_val is None else min_val
        self.high = 2**30 if max_val is None else max_val
        self.measured: dict[Any, Any] = {}  # by this rank, before the search asked
        self.seen: dict[Any, Any] = {}  # every timing the search was given

    def _clamp(self, value: Any) -> Any:
        return min(max(value, self.low), self.high)

    def first_round(self) -> None:
        for value in dict.fromkeys(self._clamp(v)
                                   for v in (self.init // 2, self.init, self.init * 2)):
            if self._measure_unless_busy(value) is not None:
                triton_stats._add(fusion_left_to_peer=1)

    def timing(self, value: Any) -> Any:
        """The timing of ``value``, for Inductor's search."""
        if value not in self.measured:
            busy = self._measure_unless_busy(value)
            if busy is not None and value != self.init:
                self._measure_ahead(value, busy)
        self.seen[value] = self.measured[value] if value in self.measured else self.fn(value)
        return self.seen[value]

    def _measure_ahead(self, value: Any, busy: Mapping[str, Any]) -> None:
        """While a peer measures ``value`` (its benchmark's key ``busy``), measure the
        search's next value in the same direction, the first that is free."""
        best = min(self.seen.values(), default=None)  # the timing value must beat
        if best is None:
            return

        peers_ms: float | None = None  # the peer's timing once in: read (and counted) once

        def wanted() -> bool:
            nonlocal peers_ms
            if peers_ms is None:
                peers_ms = _peers_timing(busy)
            return peers_ms is None or peers_ms < best

        ahead = value
        for _ in range(SPLIT_STEPS_AHEAD):
            further = self._clamp(ahead // 2 if value < self.init else ahead * 2)
            if further == ahead or further in self.measured:
                return
            ahead = further
            if self._measure_unless_busy(ahead, wanted) is None:
                if ahead in self.measured:
                    triton_stats._add(split_values_ahead=1)
                return

    def _measure_unless_busy(self, value: Any,
                             wanted: Callable[[], bool] | None = None) -> Any:
        """Measure ``value`` into ``measured``; the key of its fusion benchmark if a peer
        is measuring it instead; None if it raised or was stopped as no longer wanted."""
        _fusion_local.prefetching = True
        _fusion_local.left_to_peer = None
        _fusion_local.wanted = wanted
        try:
            timing = self.fn(value)
        except _PeerMeasuring:
            pass
        except _NoLongerWanted:
            triton_stats._add(split_values_stopped=1)
            return None
        except Exception:  # noqa: BLE001 - Inductor's own call raises it, if it asks
            return None
        finally:
            _fusion_local.prefetching = False
            _fusion_local.wanted = None
        # Checked apart from the exception, in case code between fn and the benchmark
        # turned it into a timing.
        if _fusion_local.left_to_peer is not None:
            return _fusion_local.left_to_peer
        self.measured[value] = timing
        return None


def _peers_timing(key: Mapping[str, Any]) -> float | None:
    """The stored timing of the fusion benchmark ``key`` a peer is measuring; None while it
    is not in, or cannot be read."""
    try:
        answer = _TRITON.cache().lookup(key) if _TRITON is not None else None
    except Exception:  # noqa: BLE001 - not known: go on measuring
        return None
    return None if answer is None else fusion_ms_from_entry(answer.timings)


def _stopping_unwanted(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CoordescTuner.call_func`` (one coordinate-descent benchmark) that first stops a
    split-size value measured ahead which the search no longer wants
    (:func:`_splitting_single_field`): coordinate descent is most of such a value's
    measurement, and the benchmarks are where it can stop."""

    def call_func(self: Any, func: Any, config: Any) -> Any:
        _stop_unless_wanted()
        return orig(self, func, config)

    return call_func


def _keeping_hit_configs(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``CachingAutotuner._dynamic_scale_rblock`` that leaves a cache hit's config alone.

    2.11 adds smaller-R0_BLOCK variants of a reduction config that uses many registers
    at every precompile, a hit's single stored config included, and then benchmarks the
    two (a warm job tuned again). 2.13 returns early for a hit: the stored config was
    chosen with those variants among the candidates. This is that check.
    """

    def _dynamic_scale_rblock(self: Any, *args: Any, **kwargs: Any) -> Any:
        info = getattr(self, "autotune_cache_info", None) or {}
        if info.get("autotune_cache_state") == "hit":
            return None
        return orig(self, *args, **kwargs)

    return _dynamic_scale_rblock


def _install_fusion_sharing() -> tuple[type, Any]:
    """Wrap TritonScheduling.benchmark_codegened_module; returns (class, original)."""
    from torch._inductor.codegen.triton import TritonScheduling

    orig = TritonScheduling.__dict__.get("benchmark_codegened_module")
    if not callable(orig) or _param_names(orig)[:1] != ("mod",):
        raise TypeError("TritonScheduling.benchmark_codegened_module(mod, ...) changed")
    TritonScheduling.benchmark_codegened_module = _sharing_fusion_benchmark(orig)
    return TritonScheduling, orig


@dataclasses.dataclass
class _TritonPatch:
    """What _enable_triton changed, to put back."""

    remote_cls: Any
    autotune_remote_cache: Any
    compile_threads: Any
    create: Any  # AutotuneCache.__dict__["create"] (a staticmethod)
    ours: Any
    fusion: tuple[type, Any] | None = None  # (TritonScheduling, its own benchmark method)


def _enable_triton(
    cache: Callable[[], TuneCache], db_url: str, *, worker: bool = False
) -> _TritonPatch | None:
    """Plug tunecache in as Inductor's remote autotune cache (see this section's notes).

    ``cache`` returns the TuneCache (opened lazily) of the database ``db_url``;
    ``worker``: see :class:`_TritonCache`.
    """
    global _TRITON, _TRITON_PATCH, _triton_atexit
    if _TRITON_PATCH is not None:
        # Enabled from the environment when autotune_cache was imported, before the
        # GEMM hooks: take it over, with the hooks' cache.
        _disable_triton(_TRITON_PATCH)
        _TRITON_PATCH = None
    try:
        from torch._inductor import config
        from torch._inductor import remote_cache as rc
        from torch._inductor.runtime import autotune_cache as ac

        missing = [
            what for what, ok in (
                ("remote_cache.RemoteAutotuneCache", hasattr(rc, "RemoteAutotuneCache")),
                ("remote_cache.RemoteCache", hasattr(rc, "RemoteCache")),
                ("remote_cache.RemoteCachePassthroughSerde",
                 hasattr(rc, "RemoteCachePassthroughSerde")),
                ("AutotuneCache.create", isinstance(ac.AutotuneCache.__dict__.get("create"),
                                                    staticmethod)),
                ("config.autotune_remote_cache", hasattr(config, "autotune_remote_cache")),
                ("config.compile_threads", hasattr(config, "compile_threads")),
            ) if not ok
        ]
        create = ac.AutotuneCache.__dict__.get("create")
        if not missing and _param_names(create.__func__) != (
            "inductor_meta", "filename", "configs_hash"
        ):
            missing.append("AutotuneCache.create(inductor_meta, filename, configs_hash)")
        if missing:
            log.warning(
                "tunecache: Triton kernel autotuning is not shared (missing: %s); GEMM "
                "autotuning is", ", ".join(missing),
            )
            return None
        ours = _remote_cache_class()
        patch = _TritonPatch(rc.RemoteAutotuneCache, config.autotune_remote_cache,
                             config.compile_threads, create, ours)
        _TRITON = _TritonCache(cache, worker=worker)
        rc.RemoteAutotuneCache = ours
        ac.AutotuneCache.create = staticmethod(_rekey_create(create.__func__, ours))
        config.autotune_remote_cache = True
        _ensure_runtime_hooks(ours)
        if not worker:  # compile workers never benchmark fusions
            try:
                patch.fusion = _install_fusion_sharing()
            except Exception as e:  # noqa: BLE001 - fusion benchmarks run as usual
                log.warning("tunecache: fusion benchmark timings are not shared (%s: %s)",
                            type(e).__name__, e)
        if not worker and config.compile_threads != 1 and not _workers_read_cache(db_url):
            config.compile_threads = 1
            log.info(
                "tunecache: set torch._inductor.config.compile_threads=1, so that Triton "
                "kernels load (and read the shared autotune cache) in this process: "
                "compile workers only reach it when TUNECACHE_DB names this database and "
                "tunecache's torch.backends entry point is installed (docs/triton-autotune.md)"
            )
        if not _triton_atexit:
            _triton_atexit = True
            atexit.register(_flush_triton)
        return patch
    except Exception as e:  # noqa: BLE001 - the GEMM hooks stay; Triton as usual
        log.warning("tunecache: Triton kernel autotuning is not shared (%s: %s)",
                    type(e).__name__, e)
        return None


def _disable_triton(patch: _TritonPatch | None) -> None:
    global _TRITON
    state, _TRITON = _TRITON, None
    if state is not None:
        state.flush()
        if isinstance(state.cache, _EnvCache):
            state.cache.close()  # the hooks' cache is closed with the hooks
    if patch is None:
        return
    from torch._inductor import config
    from torch._inductor import remote_cache as rc
    from torch._inductor.runtime import autotune_cache as ac

    _remove_runtime_hooks()
    if patch.fusion is not None:
        cls, orig = patch.fusion
        cls.benchmark_codegened_module = orig  # type: ignore[attr-defined]
    if rc.RemoteAutotuneCache is patch.ours:
        rc.RemoteAutotuneCache = patch.remote_cls
    ac.AutotuneCache.create = patch.create
    config.autotune_remote_cache = patch.autotune_remote_cache
    config.compile_threads = patch.compile_threads


def _flush_triton() -> None:
    state = _TRITON
    if state is not None:
        try:
            state.flush()
        except Exception:  # noqa: BLE001 - never fail interpreter shutdown
            pass


def _workers_read_cache(db_url: str) -> bool:
    """Whether Inductor's compile workers will plug in the cache of ``db_url`` themselves.

    They inherit this process's environment and run ``import torch``, which runs the
    ``torch.backends`` entry points unless TORCH_DEVICE_BACKEND_AUTOLOAD=0; ours then
    enables Triton sharing from TUNECACHE_* (:func:`_enable_triton_from_env`).
    """
    from importlib import metadata

    from .settings import Settings

    if os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0":
        return False
    try:
        env = Settings.from_env()
    except Exception:  # noqa: BLE001 - a bad environment: workers would not read it
        return False
    if env.mode == "off" or not env.triton_configs or env.db_url != db_url:
        return False
    try:
        points = metadata.entry_points(group="torch.backends")
    except Exception:  # noqa: BLE001 - broken metadata: assume not installed
        return False
    return any(p.value == "tunecache._autoload:torch_backend_entry" for p in points)


class _EnvCache:
    """The TuneCache of TUNECACHE_*, opened at the first use (readonly: it only reads).

    A TuneCache that cannot reach its database stops trying for the rest of the process.
    A compile worker lives as long as its job and may first look before the compiling
    process has created the database, so it opens a fresh one, at most every
    ``RETRY_SECONDS``.
    """

    RETRY_SECONDS = 10.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: TuneCache | None = None
        self._opened = 0.0

    def __call__(self) -> TuneCache:
        with self._lock:
            stale = self._cache is not None and self._cache.disabled_reason is not None \
                and time.monotonic() - self._opened > self.RETRY_SECONDS
            if self._cache is None or stale:
                import tunecache

                if self._cache is not None:
                    self._cache.close()
                self._cache = tunecache.open(mode="readonly")
                self._opened = time.monotonic()
            return self._cache

    def close(self) -> None:
        with self._lock:
            if self._cache is not None:
                self._cache.close()
                self._cache = None


def _enable_triton_from_env() -> None:
    """Called by the autoload hook when ``torch._inductor.runtime.autotune_cache`` is
    imported: in Inductor's compile workers, the only way our code runs there (this
    section's notes). In the compiling process the GEMM hooks take it over moments later
    (:func:`enable`), when select_algorithm is imported."""
    global _TRITON_PATCH
    from .settings import Settings

    settings = Settings.from_env()
    if _TRITON is not None or settings.mode == "off" or not settings.triton_configs:
        return
    version = _torch_version()
    low, high = SUPPORTED_TORCH
    if version is None or not (low <= version <= high):
        return  # enable() says why, once, in the compiling process
    _TRITON_PATCH = _enable_triton(_EnvCache(), settings.db_url, worker=True)



# ------------------------------------------------------------------------- enable/disable

_HOOKS: _Hooks | None = None
_ENABLE_LOCK = threading.Lock()
_version_warned = False


def _param_names(fn: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(fn).parameters if p != "self")


def _refuse(reason: str) -> bool:
    global _version_warned
    if not _version_warned:
        _version_warned = True
        log.warning("tunecache: not enabled for Inductor: %s; Inductor autotunes as usual", reason)
    return False


def is_enabled() -> bool:
    """Whether the hooks are installed (in either mode)."""
    return _HOOKS is not None


def enable(
    cache: TuneCache | None = None, *, count_only: bool = False, **settings: Any
) -> bool:
    """Route Inductor's GEMM autotuning through tunecache; returns whether hooks are on.

    ``cache``: a ``tunecache.TuneCache`` to use; by default one is opened (lazily, at the
    first autotuned op) with ``tunecache.open(**settings)``, i.e. from TUNECACHE_* unless
    overridden. ``count_only=True`` installs only the benchmark counter (:data:`stats`),
    no cache. TUNECACHE_MODE=off enables nothing. Calling it again replaces the hooks.
    """
    global _HOOKS
    version = _torch_version()
    low, high = SUPPORTED_TORCH
    if version is None or not (low <= version <= high):
        import torch

        return _refuse(
            f"torch {torch.__version__} is outside the supported "
            f"{low[0]}.{low[1]}-{high[0]}.{high[1]}"
        )
    share_triton = False
    chosen_url = ""
    if not count_only:
        from .settings import Settings

        chosen = cache.settings if cache is not None else Settings.from_env(**settings)
        if chosen.mode == "off" and cache is None:
            log.info("tunecache: TUNECACHE_MODE=off, Inductor autotunes as usual")
            return False
        share_triton = chosen.triton_configs
        chosen_url = chosen.db_url

    from torch._inductor import config
    from torch._inductor import select_algorithm

    selector = select_algorithm.get_algorithm_selector_cache()
    cls = type(selector)
    if _param_names(cls.lookup) != _LOOKUP_PARAMS or _param_names(
        cls.make_precompile_fn
    ) != _PRECOMPILE_PARAMS:
        return _refuse("AlgorithmSelectorCache.lookup/make_precompile_fn changed signature")

    with _ENABLE_LOCK:
        if _HOOKS is not None:
            _disable_locked()
        hooks = _Hooks(selector, cache, settings, count_only)
        orig_lookup = cls.lookup.__get__(selector, cls)
        orig_precompile = cls.make_precompile_fn.__get__(selector, cls)

        def lookup(
            self: Any,
            choices: list[Any],
            op: str,
            inputs: str,
            benchmark: Callable[[Any], dict[Any, float]] | None,
            hint_override: int | None = None,
        ) -> dict[Any, float]:
            return hooks.lookup(orig_lookup, choices, op, inputs, benchmark, hint_override)

        def make_precompile_fn(
            self: Any,
            choices: list[Any],
            name: str,
            inputs_key: str,
            precompilation_timeout_seconds: int | None = 60 * 60,
        ) -> Callable[[], dict[Any, float]]:
            try:
                hooks.note_choices(choices, name, inputs_key)
            except Exception as e:  # noqa: BLE001 - only the deferred pass loses this op
                hooks.warn_once("recording a deferred GEMM", e)
            return orig_precompile(
                choices,
                name,
                inputs_key,
                precompilation_timeout_seconds=precompilation_timeout_seconds,
            )

        selector.lookup = types.MethodType(lookup, selector)
        selector.make_precompile_fn = types.MethodType(make_precompile_fn, selector)
        if not count_only:
            if getattr(config, "distributed_max_autotune_gemm", False):
                config.distributed_max_autotune_gemm = False
                log.info(
                    "tunecache: turned off torch._inductor.config.distributed_max_autotune_gemm; "
                    "tunecache shares GEMM autotuning across ranks and jobs instead"
                )
            hooks.prev_pass = config._pre_fusion_custom_pass
            hooks.our_pass = _make_pre_fusion_pass(hooks, hooks.prev_pass)
            config._pre_fusion_custom_pass = hooks.our_pass
            if share_triton:
                hooks.triton_patch = _enable_triton(hooks.cache, chosen_url)
        _HOOKS = hooks
    log.debug("tunecache: Inductor hooks installed (count_only=%s)", count_only)
    return True


def _disable_locked() -> None:
    global _HOOKS
    hooks, _HOOKS = _HOOKS, None
    if hooks is None:
        return
    _disable_triton(hooks.triton_patch)
    for name in ("lookup", "make_precompile_fn"):
        hooks.selector.__dict__.pop(name, None)  # the class method shows through again
    if hooks.our_pass is not None:
        from torch._inductor import config

        if config._pre_fusion_custom_pass is hooks.our_pass:
            config._pre_fusion_custom_pass = hooks.prev_pass
    hooks.close()


def disable() -> None:
    """Remove the hooks (Inductor's own autotuning again) and close the cache we opened."""
    with _ENABLE_LOCK:
        _disable_locked()


def _enable_from_env() -> None:
    """Called by the autoload hook (tunecache._autoload) once select_algorithm exists."""
    if os.environ.get("TUNECACHE_INDUCTOR_COUNT_ONLY") == "1":
        enable(count_only=True)
    else:
        enable()
