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
fresh TORCHINDUCTOR_CACHE_DIR and the FX graph / AOTAutograd caches off (a graph hit skips
lowering, and with it every autotune lookup).

Rooms: ``ops`` (what warm can rebuild), ``inputs`` (the recorded inputs key),
``choose`` (recorded keys to warm; no torch), ``build`` (tensors and the function to
compile), ``run`` (compile them, tunecache enabled), ``exhaustive`` (``--exhaustive``:
re-tune transferred entries in full and record their regret). torch is imported lazily:
importing this package (or tunecache.cli) never imports torch.
"""

from __future__ import annotations

from .build import build_call
from .choose import WarmTask, select_tasks
from .exhaustive import ExhaustiveReport, ExhaustiveTask, exhaustive, select_transferred
from .inputs import check_inputs, parse_inputs
from .ops import NOT_WARMED, WARM_OPS
from .run import WarmReport, classify, warm

__all__ = ["WARM_OPS", "NOT_WARMED", "WarmTask", "select_tasks", "warm", "WarmReport",
           "parse_inputs", "check_inputs", "build_call", "classify", "ExhaustiveTask",
           "ExhaustiveReport", "select_transferred", "exhaustive"]


