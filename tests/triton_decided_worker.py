"""One rank of tests/test_triton_transfer.py's two-process test, run as a script:
``triton_decided_worker.py DB TMP INDEX``. It loads the silu kernel at 2048 tokens with
TUNECACHE_LEVERS=+decisive_triton (its neighbour at 1024 recorded by the test), waits for
its peer at a file barrier, runs the kernel once, and prints one JSON line: the load's state, the
config it ran, and its Triton counters."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import procs
import triton_fake_autotuner as fa
from test_triton_transfer import SILU, _configs, _load_autotuner, fake_ms, source
from torch._inductor.runtime import autotune_cache as ac
from triton_fakes import TritonConfig

import tunecache


def main(db: str, tmp: str, index: int) -> None:
    ac.Config = TritonConfig  # triton.Config; no triton on the CPU
    fa.FakeAutotuner.bench = lambda self, launcher, *a, **k: fake_ms(launcher.config)
    os.environ["TUNECACHE_LEVERS"] = "+decisive_triton"
    cache = tunecache.open(db)
    assert tunecache.enable(cache)
    path = Path(tmp) / f"rank-{index}" / "kernel.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source(SILU, 2048, index))
    kernel = _load_autotuner(fa, str(path), _configs(2048))
    state = kernel.autotune_cache_info["autotune_cache_state"]
    kernel.precompile()
    procs.file_barrier(Path(tmp), index, 2)  # the two reach the first run together
    kernel.run("arg", stream=0)
    ran = kernel.launched[-1]
    print(json.dumps({"state": state, "ran": [ran.kwargs, ran.num_warps],
                      "stats": tunecache.stats().triton.as_dict()}, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
