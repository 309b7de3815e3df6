"""A process that runs a user's ``@triton.autotune`` kernel the way a library's user does:
``TUNECACHE_DB`` in its environment, no tunecache code. Run by tests/test_user_kernels.py
under Triton's interpreter (no GPU), so the kernel runs on CPU tensors and each config is
timed by a ``do_bench`` of the kernel's own, which also counts the benchmarks.

    python user_kernel_worker.py OUT.json --sizes 1000,3000 [--variant changed]
        [--barrier DIR --parties N --index I] [--prune 128] [--limit 64] [--config-hook]
        [--twin-hooks] [--freeze FILE]

Writes OUT.json: how many configs it benchmarked, the winner of every size, whether the
output of every call was right, and tunecache's user-kernel counters. The kernel adds
``x`` into ``out`` (``restore_value``: tuning runs must not leave their sums behind) and,
through a heuristic, refuses blocks above ``--limit`` the way a GPU with too little
shared memory does (``OutOfResources``), which Triton's benchmark counts as a failed
config.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch  # first, as in a job: importing it runs tunecache's autoload hook
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--sizes", default="1000")
p.add_argument("--variant", choices=("original", "changed"), default="original")
p.add_argument("--barrier", default=None)
p.add_argument("--parties", type=int, default=1)
p.add_argument("--index", type=int, default=0)
p.add_argument("--prune", type=int, default=None, help="keep only configs of blocks up to this")
p.add_argument("--limit", type=int, default=1 << 20, help="largest block that launches")
p.add_argument("--config-hook", action="store_true", help="configs carry a pre_hook")
p.add_argument("--twin-hooks", action="store_true",
               help="two configs that differ only in their (lambda) pre_hooks")
p.add_argument("--freeze", default=None, metavar="FILE",
               help="at the first benchmark, create FILE and hang (to be killed)")
args = p.parse_args()

benchmarks = 0


def cpu_bench(kernel_call, quantiles):  # type: ignore[no-untyped-def]
    """Triton's benchmark needs a GPU driver; under the interpreter, a kernel's own
    ``do_bench`` times it (the same hook Triton offers every kernel). Called once per
    config benchmarked."""
    global benchmarks
    benchmarks += 1
    if args.freeze:
        Path(args.freeze).touch()
        time.sleep(600)
    t0 = time.perf_counter()
    kernel_call()
    ms = (time.perf_counter() - t0) * 1000
    return [ms, ms, ms]


hook_calls = 0


def _hook(nargs):  # type: ignore[no-untyped-def]
    """A config's pre_hook (Liger-Kernel's TMA matmuls set up descriptors in theirs)."""
    global hook_calls
    hook_calls += 1


def _configs() -> list[triton.Config]:
    if args.twin_hooks:  # two configs only their hooks tell apart, both named <lambda>
        return [triton.Config({"BLOCK": 64}, num_warps=1, pre_hook=lambda nargs: None),
                triton.Config({"BLOCK": 64}, num_warps=1, pre_hook=lambda nargs: None)]
    hook = _hook if args.config_hook else None
    return [triton.Config({"BLOCK": b}, num_warps=w, pre_hook=hook)
            for b, w in ((64, 1), (128, 2), (256, 4))]


def _prune(configs, named_args, **kwargs):  # type: ignore[no-untyped-def]
    return [c for c in configs if c.kwargs["BLOCK"] <= args.prune]


def _fits(meta):  # type: ignore[no-untyped-def]
    if meta["BLOCK"] > args.limit:
        raise OutOfResources(meta["BLOCK"], args.limit, "block")
    return 1


if args.variant == "original":
    @triton.jit
    def accumulate(x, out, n, BLOCK: tl.constexpr, CHECKED: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(out + offs, mask=mask) + tl.load(x + offs, mask=mask),
                 mask=mask)
else:  # the same kernel after a library upgrade edited it
    @triton.jit
    def accumulate(x, out, n, BLOCK: tl.constexpr, CHECKED: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        total = tl.load(out + offs, mask=mask) + tl.load(x + offs, mask=mask)
        tl.store(out + offs, total, mask=mask)

accumulate = triton.autotune(
    configs=_configs(), key=["n"], do_bench=cpu_bench, restore_value=["out"],
    prune_configs_by={"early_config_prune": _prune} if args.prune else None,
)(triton.heuristics({"CHECKED": _fits})(accumulate))

if args.barrier:
    # Every party starts its first call together, so the claims race.
    Path(args.barrier, f"ready-{args.index}").touch()
    deadline = time.monotonic() + 180  # a loaded machine starts workers slowly
    while len(list(Path(args.barrier).glob("ready-*"))) < args.parties:
        if time.monotonic() > deadline:
            sys.exit("the other workers never arrived")
        time.sleep(0.01)

report: dict = {"winners": {}, "correct": {}, "benchmarks": 0}
for n in [int(s) for s in args.sizes.split(",")]:
    x = torch.arange(n, dtype=torch.float32)
    out = torch.ones(n)
    accumulate[lambda meta, n=n: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    report["winners"][str(n)] = accumulate.best_config.kwargs["BLOCK"]
    report["correct"][str(n)] = bool(torch.equal(out, x + 1))

import tunecache  # noqa: E402 - only to read the counters

report["benchmarks"] = benchmarks
report["hook_calls"] = hook_calls
report["stats"] = tunecache.stats().user_kernels.as_dict()
report["pid"] = os.getpid()
Path(args.out).write_text(json.dumps(report))
