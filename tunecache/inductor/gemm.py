"""Inductor's GEMM autotuning through the shared cache: keys and candidate identities,
and the state of the two selector hooks (``lookup`` and ``make_precompile_fn``).

Hooks, and why each is safe
---------------------------
All GEMM (and convolution) autotuning goes through the process-wide singleton
``torch._inductor.select_algorithm.get_algorithm_selector_cache()``. We override two
methods of its class, ``AlgorithmSelectorCache``, through the patch ledger
(tunecache/inductor/gemm_hooks.py); the lowering registry is untouched, and
:func:`disable` puts the class's own back (``lookup`` it inherits: ours is deleted). A
later patch of either method (on the class, a base class or the instance) is the caller's
to win: ours is hidden, or passes through, for its duration (:meth:`GemmHooks.serving`).

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

Before either hook runs, a GEMM whose key is stored has had its Triton template choices
cut to those that can win (``InductorChoices._finalize_template_configs``, see
:mod:`.narrow`), so both see fewer candidates, all of them in the stored entry.

We deliberately do not patch ``tuned_mm`` & co (the lowering registry holds references
to the originals), ``autotune_select_algorithm`` (modules import it by name) or
``AlgorithmSelectorCache.__call__`` (its return type changed: 2.11 returns the node,
2.13+ returns ``(node, choice)``).


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
    stored entry tunes only the missing ones, under the key's top-up key (the key plus
    ``"extra_candidates"``, the sorted missing ids: :func:`tunecache.keys.top_up_key`;
    entries are immutable), and merges. Stored candidates this compile lacks are ignored.
    What this process read, wrote or is tuning is kept by :class:`.entries.GemmEntries`.

Every rank picks the same winner: its timings come from the one shared entry.

``distributed_max_autotune_gemm``
    Inductor's own distributed autotune (2.11-2.14: aten.mm only, all ranks must compile
    identical graphs, all_gather over NCCL, nothing persists) and tunecache replace the
    same thing. When tunecache is enabled it wins: :func:`enable` turns the flag off with
    one info log, and :func:`disable` turns it back on. tunecache covers every GEMM op,
    tolerates ranks that compile different graphs and persists across jobs, so keeping
    both would only add an all_gather whose placeholders (``_DistributedAutotuneBuffer``)
    bypass the shared cache. If the flag is switched on again later (``config.patch``),
    tunecache logs one warning and still serves every GEMM that reaches ``lookup``.

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

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import keys as tc_keys
from ..core.result import Tuned
from .entries import GemmEntries
from .fingerprint import environment
from .state import REGISTRY
from .transfer import baseline_meta, gemm_family, measure_by_plan

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..core.cache import TuneCache
    from ..opener import CacheOpener

__all__ = ["candidate_id", "candidate_ids", "device_type_of", "make_key", "gemm_key",
           "GemmHooks"]

log = logging.getLogger("tunecache")


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


def device_type_of(choices: Sequence[Any], inputs: str) -> str:
    for choice in choices:
        layout = getattr(choice, "layout", None)
        device = getattr(layout, "device", None)
        if device is not None:
            return str(device.type)
    # inputs_key is a repr of tuples that start with the device type
    return inputs.split("'")[1] if inputs.count("'") >= 2 else "unknown"


# torch 2.15 times each op under a benchmark policy and passes lookup() its inputs key
# with the policy appended (select_algorithm.create_benchmark_cache_key).
_POLICY = ":benchmark_policy="


def split_benchmark_policy(inputs: str) -> tuple[str, str | None]:
    """(inputs key, policy) of what lookup() got: the policy is None for an older torch's
    key and for 2.15's ``eager`` one, which times as the older versions do, so that their
    keys are one key and an upgrade finds the older entry."""
    head, sep, policy = inputs.partition(_POLICY)
    if not sep or policy == "eager":
        return head, None
    return head, policy


def make_key(
    op: str, inputs: str, hint_override: int | None, device_type: str
) -> dict[str, Any]:
    """The shared-cache key of one autotuned op (see this module's docstring)."""
    import torch

    inputs_key, policy = split_benchmark_policy(inputs)
    key: dict[str, Any] = {
        "kind": "gemm",
        "op": op,
        "env": environment(device_type),
        "inputs": inputs_key,
        "precision": torch.get_float32_matmul_precision(),
        "hint_override": hint_override,
    }
    if policy is not None:  # CUDA graphs timings are not eager ones: another key
        key["benchmark_policy"] = policy
    return key


def gemm_key(op: str, inputs: str, hint_override: int | None, device_type: str) -> tc_keys.Key:
    """The :class:`~tunecache.keys.Key` of :func:`make_key`'s mapping, with its family
    (transfer.py)."""
    mapping = make_key(op, inputs, hint_override, device_type)
    return tc_keys.Key.of(mapping, family=gemm_family(mapping))


class BenchmarkFailed(Exception):
    """Carries an exception raised by Inductor's benchmark through the core, so that we
    re-raise it untouched instead of mistaking it for a tunecache failure."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


class Lowered(NamedTuple):
    """A candidate list as make_precompile_fn saw it, before Inductor pruned it."""

    list_id: int  # id() of the list (MultiTemplateBuffer keeps the same list)
    op: str
    inputs_key: str
    refs: tuple[weakref.ref[Any], ...]


def _measuring(
    benchmark: Callable[[Any], dict[Any, float]],
    choices: list[Any],
    ids: list[str],
    taken: dict[Any, float],
) -> Callable[[list[Any], str], dict[str, float]]:
    """``bench(subset, measured_key)``: Inductor's benchmark on some of a lookup's
    choices, timings by candidate id; each run counted for the key it measures, its raw
    timings kept in ``taken`` for the fallback."""

    def bench(subset: list[Any], measured_key: str) -> dict[str, float]:
        t0 = time.perf_counter()
        try:
            raw = benchmark(subset)
        except BaseException as e:
            raise BenchmarkFailed(e) from e
        finally:
            REGISTRY.stats.count_benchmark(len(subset), time.perf_counter() - t0, measured_key)
        taken.update(raw)
        by_choice = dict(zip(map(id, choices), ids))
        # inf for anything the benchmark did not return (Inductor asserts it returns
        # every choice; this is belt and braces for the stored entry).
        return {
            by_choice[id(c)]: tc_keys.to_ms(raw.get(c, math.inf)) for c in subset
        }

    return bench


class GemmHooks:
    """State of the installed hooks (one per process, see :func:`enable`)."""

    def __init__(self, selector: Any, opener: CacheOpener | None) -> None:
        self.selector = selector
        # The cache every hook of this enable() shares; None: count-only hooks, no cache.
        self.opener = opener
        self.count_only = opener is None
        self._warned = False
        self.lock = threading.RLock()
        # What this process knows of the entries it read, wrote or is tuning.
        self.entries = GemmEntries(self.cache)
        # choices list (by its first choice, weakly) -> how make_precompile_fn saw it
        self.pending: weakref.WeakKeyDictionary[Any, Lowered] = weakref.WeakKeyDictionary()
        self._dist_warned = False

    # -- helpers

    def serving(self) -> bool:
        """Whether this process's lookup is tunecache's now, not one patched over it
        (replaced where the hooks are installed, gemm_hooks.py)."""
        return True

    def warn_once(self, what: str, error: BaseException) -> None:
        with self.lock:
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

    @property
    def broken(self) -> bool:
        """The cache could not be opened: Inductor's own from now on."""
        return self.opener is not None and self.opener.broken

    def cache(self) -> TuneCache:
        if self.opener is None:
            raise RuntimeError("count-only hooks have no cache")
        return self.opener()

    def counted(
        self, benchmark: Callable[[Any], Any], key_hash: str | None = None
    ) -> Callable[[Any], Any]:
        def run(choices: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return benchmark(choices)
            finally:
                REGISTRY.stats.count_benchmark(len(choices), time.perf_counter() - t0, key_hash)

        return run

    def _record_counted(
        self, choices: list[Any], op: str, inputs: str, hint_override: int | None
    ) -> str | None:
        """Count-only mode: note which key Inductor looked up (for distinct-key counts)."""
        try:
            key = make_key(op, inputs, hint_override, device_type_of(choices, inputs))
            key_hash = tc_keys.key_hash(key)[0]
            REGISTRY.stats.record("counted", {"op": op, "key_hash": key_hash, "best": None,
                                      "candidates": len(choices)})
            return key_hash
        except Exception as e:  # noqa: BLE001 - counting must never break a compile
            log.debug("tunecache: could not record a counted lookup: %r", e)
            return None

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
        if self.count_only or self.broken:
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
        except BenchmarkFailed as e:
            raise e.error from None
        except Exception as e:  # noqa: BLE001 - any tunecache failure: Inductor's own path
            self.warn_once(f"looking up {op} timings", e)
            REGISTRY.stats.record("fallback", {"op": op, "key_hash": None, "best": None})
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
        key = gemm_key(op, inputs, hint_override, device_type_of(choices, inputs))
        if benchmark is None:
            # make_precompile_fn's probe: answer only with a full hit, never claim or wait.
            known = self._probe(key, ids)
            if known is not None:
                return {c: known.get(i, math.inf) for c, i in zip(choices, ids)}
            return {}
        bench = _measuring(benchmark, choices, ids, taken)

        def tune() -> Tuned:
            return self._tune(key, choices, ids, op, inputs, bench)

        slot = self.entries.tuning(key)
        if slot is not None:
            # We are inside our own get_or_tune_many tune(key) for this key (deferred
            # path): measure and hand the timings back to it, which publishes them.
            measured = tune()
            self.entries.fill(slot, measured, measured.meta)
            # counted by tune_deferred, which learns the result's source from the core
            return {c: measured.get(i, math.inf) for c, i in zip(choices, ids)}

        timings, source = self.entries.get_or_tune(key, tune)
        timings, missing_ids = self._complete(key, timings, choices, ids, bench)
        answer = {i: timings.get(i, math.inf) for i in ids}
        best = tc_keys.best_candidate(answer)
        if best is None and source != "tuned" and tc_keys.best_candidate(timings) \
                is not None:
            # The entry timed other candidates only (a decision naming a kernel this
            # call lacks): the first job that measures the key replaces it.
            replaced = self.entries.replace(key, ids, tune)
            if replaced is not None:
                timings, missing_ids = self._complete(key, replaced, choices, ids, bench)
                answer = {i: timings.get(i, math.inf) for i in ids}
                best, source = tc_keys.best_candidate(answer), "tuned"
        if best is None:
            # Nothing in this compile has a finite stored timing: never trust that.
            raise ValueError(f"no candidate of this {op} compile has a finite stored timing")
        # Which candidates were new says why a key needed a top-up (tools/bench_gpu.py).
        event = {"op": op, "key_hash": key.hash, "best": best, "candidates": len(ids),
                 "missing": len(missing_ids), "missing_ids": missing_ids[:8]}
        REGISTRY.stats.record(source, event)
        return {c: answer[i] for c, i in zip(choices, ids)}

    def _complete(self, key: tc_keys.Key, timings: dict[str, float], choices: list[Any],
                  ids: list[str], bench: Callable[[list[Any], str], dict[str, float]],
                  ) -> tuple[dict[str, float], list[str]]:
        """The key's timings with every candidate of this compile, and the ids of those
        tuned now (sorted). A transferred entry's lacks some on purpose: they come only
        from an exhaustive top-up (:meth:`.entries.GemmEntries.with_top_up`). Any other
        entry's missing ones are tuned under its top-up key and merged; so are all of a
        decided entry's, whose one timing is a neighbour's (:meth:`.entries.GemmEntries.
        untimed`), and the top-up's timing then replaces it."""
        if self.entries.transferred(key):
            return self.entries.with_top_up(key, timings, ids), []
        missing_ids = self.entries.untimed(key, timings, ids)
        if not missing_ids:
            return timings, []
        untimed = set(missing_ids)
        missing = [c for c, i in zip(choices, ids) if i in untimed]
        extra_key = tc_keys.top_up_key(key, missing_ids)
        extra, _ = self.entries.get_or_tune(extra_key, lambda: bench(missing, extra_key.hash))
        return {**timings, **{i: extra[i] for i in missing_ids if i in extra}}, missing_ids

    def _tune(self, key: tc_keys.Key, choices: list[Any], ids: list[str], op: str,
              inputs: str, bench: Callable[[list[Any], str], dict[str, float]]) -> Tuned:
        """Timings of this lookup's candidates (only the transferred ones where transfer
        applies), ``inf`` for those of its lowering that failed to compile (see
        :meth:`not_compiled`), and the entry's meta."""
        failed = self.not_compiled(choices, op, inputs)
        plan = self.entries.plan(key)
        measured, benchmarked = measure_by_plan(
            plan, choices, ids, failed, lambda subset: bench(subset, key.hash), op)
        meta = baseline_meta(measured)
        if plan is not None and benchmarked is not None:
            generated = len(choices) + len(failed) + self.entries.not_generated(key)
            meta.update(plan.meta(benchmarked, generated))
            REGISTRY.stats.add(transferred_keys=1,
                               transfer_skipped=generated - benchmarked - len(failed))
        return Tuned(measured, meta)

    def _probe(self, key: tc_keys.Key, ids: list[str]) -> dict[str, float] | None:
        timings = self.entries.stored(key)
        if timings is None:
            return None
        if self.entries.transferred(key):
            # What the transfer left out is not benchmarked: no need to precompile it.
            ids = [i for i in ids if i in timings]
        if not ids or not all(i in timings for i in ids) or (
            tc_keys.best_candidate({i: timings[i] for i in ids}) is None
        ):
            return None
        return timings

    # -- make_precompile_fn

    def note_choices(self, choices: list[Any], name: str, inputs_key: str) -> None:
        if choices:
            try:
                refs = tuple(weakref.ref(c) for c in choices)
                self.pending[choices[0]] = Lowered(id(choices), name, inputs_key, refs)
            except TypeError:  # not weak-referenceable: the deferred pass skips it
                pass

    def not_compiled(self, choices: list[Any], op: str, inputs: str) -> list[str]:
        """Ids of candidates of this lowering that failed to compile, which Inductor
        removed from ``choices`` before asking for timings.

        Which candidates reach a lookup depends on the path: `tunecache warm`'s compile
        got the list without them, the job after it got them all (torch 2.11: a Triton mm
        config that needs more shared memory than the GPU has, on every mm key), so the
        job benchmarked them as new candidates. Stored as not runnable (``inf``), they make
        both lists full hits of one entry.
        """
        try:
            lowered = self.pending.get(choices[0]) if choices else None
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
