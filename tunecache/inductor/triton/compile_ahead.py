"""A kernel's next candidate configs compiled in a few threads while the thread that tunes
it benchmarks the previous ones.

Inductor tunes a Triton kernel one config at a time, and compiles each config just before
it benchmarks it, in the thread that benchmarks: coordinate descent
(``CoordescTuner.autotune``, whose ``benchmark_one_config`` calls the kernel's
``_precompile_config``, then ``bench``), and tunecache's transfer, which benchmarks the
configs of a kernel's recorded neighbours the same way (coordesc.py). Compiling is most of
a descent's time on a GPU host (docs/benchmarks.md, 2026-12-05: 139 benchmarks took 2.6 s
of 12.6 s of descent), and Triton spends most of a compile outside the GIL (ptxas, LLVM
and MLIR passes: tools/bench_compile_threads.py), which Inductor itself relies on when it
compiles template candidates in a thread pool.

What a descent benchmarks next is known ahead: the neighbours of the best config so far,
one step along each tunable field (the tuner's own ``tunable_fields``,
``get_neighbour_values``, ``set_field`` and ``is_valid_config``). So each time the best
changes, its neighbours are submitted to the threads in the order the descent will ask
for them, and compiles of the former best's neighbours that have not started are
dropped. The descent's compile of a config then takes the compile already done, or waits
for the one under way, or compiles it as before (a config nobody foresaw, or one no
thread has started yet: it would only wait in the queue). The same
configs are compiled with the same code, benchmarked in the same order and compared the
same way: only when each compile runs changes. A compile that fails in a thread raises
its own error where the descent asks for that config, as it would have there. Why
threads and not Inductor's compile workers: docs/decisions.md.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ...patching import Ledger
from ...process import PROCESS

log = logging.getLogger("tunecache")

__all__ = ["THREAD_NAME", "AheadCompiler", "shared_pool", "compiling_ahead",
           "compiling_descent_ahead"]

THREAD_NAME = "tunecache-compile-ahead"  # the prefix of the threads' names


def shared_pool(threads: int) -> ThreadPoolExecutor:
    """The process's compile-ahead threads (``threads`` of them), made at the first
    descent that uses them and kept by the process's owner until tunecache.disable():
    a descent's compiles are a fraction of a second each, too short to start threads
    for every descent."""
    with PROCESS.lock:
        pool = PROCESS.compile_pool
        if pool is None or PROCESS.compile_pool_threads != threads:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
            pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=THREAD_NAME)
            PROCESS.compile_pool, PROCESS.compile_pool_threads = pool, threads
        return pool


def _config_key(config: Any) -> Hashable:
    """A config's identity, as the descent's own cache of timings keys it."""
    from torch._inductor.runtime.runtime_utils import triton_config_to_hashable

    return triton_config_to_hashable(config)


class AheadCompiler:
    """Compiles of one kernel's configs, run by the process's ``threads`` compile-ahead
    threads (:func:`shared_pool`) ahead of the thread that asks for them
    (:meth:`compiled`); with no threads, each is compiled when asked for. Its methods are
    called from that one thread; the threads only run ``compile_config``."""

    def __init__(self, compile_config: Callable[[Any], Any], threads: int) -> None:
        self._compile = compile_config
        self._pool = shared_pool(threads) if threads > 0 else None
        self._compiles: dict[Hashable, Future[Any]] = {}
        self.compiled_ahead = 0  # compiles run in a thread (not dropped before they ran)
        self.served = 0  # of those, handed to the thread that asked

    def submit(self, configs: Iterable[Any]) -> None:
        """Start compiling ``configs`` (in this order) that are not started yet."""
        if self._pool is None:
            return
        for config in configs:
            key = _config_key(config)
            if key not in self._compiles:
                self._compiles[key] = self._pool.submit(self._compile, config)
                self.compiled_ahead += 1

    def drop_pending(self) -> None:
        """Forget the compiles no thread has started (the descent moved elsewhere)."""
        for key, compiling in list(self._compiles.items()):
            if compiling.cancel():
                del self._compiles[key]
                self.compiled_ahead -= 1

    def compiled(self, config: Any) -> Any:
        """``compile(config)``: the one done or under way in a thread, else compiled here
        (also where it waits behind others in the queue). A thread's compile is handed out
        once, as a compile is used once."""
        compiling = self._compiles.pop(_config_key(config), None)
        if compiling is not None and compiling.cancel():
            self.compiled_ahead -= 1
            compiling = None
        if compiling is None:
            return self._compile(config)
        self.served += 1
        return compiling.result()  # the compile's own error, if it failed

    def close(self) -> None:
        """Drop what has not started; compiles under way finish in their threads, and
        their results are dropped."""
        self.drop_pending()
        self._compiles.clear()


@contextlib.contextmanager
def compiling_ahead(compile_config: Callable[[Any], Any], configs: list[Any],
                    threads: int) -> Iterator[AheadCompiler]:
    """An :class:`AheadCompiler` with all of ``configs`` started in ``threads`` threads
    (none: each compiled when asked for), closed on the way out."""
    compiler = AheadCompiler(compile_config, threads)
    try:
        compiler.submit(configs)
        yield compiler
    finally:
        compiler.close()


class _DescentFollower:
    """Follows a coordinate descent through its tuner's ``call_func`` (every benchmark
    it asks for, the cached ones included) and keeps the neighbours of its best config
    compiling ahead. It tracks the best as the tuner does (its ``has_improvement`` over
    the best so far, starting from the first config benchmarked, the baseline)."""

    def __init__(self, tuner: Any, compiler: AheadCompiler) -> None:
        from torch._inductor.runtime import coordinate_descent_tuner as cdt

        self._tuner = tuner
        self._compiler = compiler
        self._get_field = cdt.get_field
        self._set_field = cdt.set_field
        self._call_func = tuner.call_func
        self._best_ms: float | None = None
        self._following = True

    def call_func(self, func: Callable[[Any], Any], config: Any) -> Any:
        if self._best_ms is None:  # the baseline: compile its neighbours meanwhile
            self._follow(config, None)
        ms = self._call_func(func, config)  # its errors are the descent's own
        self._follow(config, ms)
        return ms

    def _follow(self, config: Any, ms: Any) -> None:
        """Compile ahead the neighbours of ``config`` if it is the new best (timed
        ``ms``), or of the baseline before it is timed (``ms`` None)."""
        if not self._following:
            return
        try:
            if ms is not None:
                baseline = self._best_ms is None  # its neighbours are compiling already
                if not baseline and not self._tuner.has_improvement(self._best_ms, ms):
                    return
                self._best_ms = ms
                if baseline:
                    return
            self._compiler.drop_pending()
            self._compiler.submit(self._neighbours(config))
        except Exception as e:  # noqa: BLE001 - a tuner we do not know: compile as before
            self._following = False
            log.debug("tunecache: not compiling a descent's candidates ahead: %r", e)

    def _neighbours(self, config: Any) -> list[Any]:
        """The configs one step from ``config`` along each tunable field, in the order
        the descent tries them, less those it has benchmarked."""
        tuner = self._tuner
        out = []
        for field in tuner.tunable_fields:
            value = self._get_field(config, field)
            if value is None:
                continue
            for neighbour_value in tuner.get_neighbour_values(field, value):
                neighbour = copy.deepcopy(config)
                self._set_field(neighbour, field, neighbour_value)
                if tuner.is_valid_config(neighbour) \
                        and tuner.lookup_in_cache(neighbour) is None:
                    out.append(neighbour)
        return out


@contextlib.contextmanager
def compiling_descent_ahead(kernel: Any, threads: int) -> Iterator[AheadCompiler | None]:
    """Inside: ``kernel``'s coordinate descent compiles its candidates in ``threads``
    threads ahead of benchmarking them; yields the compiler (its counts), or None where
    this is off (``threads`` 0) or the kernel has no tuner as Inductor's."""
    tuner = getattr(kernel, "coordesc_tuner", None)
    needed = ("call_func", "tunable_fields", "get_neighbour_values", "is_valid_config",
              "has_improvement", "lookup_in_cache")
    if threads <= 0 or tuner is None or not all(hasattr(tuner, n) for n in needed):
        yield None
        return
    compiler = AheadCompiler(kernel._precompile_config, threads)
    follower = None
    try:
        follower = _DescentFollower(tuner, compiler)
    except Exception as e:  # noqa: BLE001 - an Inductor we do not know: compile as before
        log.debug("tunecache: not compiling a descent's candidates ahead: %r", e)
    if follower is None:
        compiler.close()
        yield None
        return
    try:
        with Ledger() as scoped:  # this descent's own: undone when it returns
            scoped.patch(tuner, "call_func", follower.call_func)
            scoped.patch(kernel, "_precompile_config", compiler.compiled)
            yield compiler
    finally:
        compiler.close()
