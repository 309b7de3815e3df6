"""One process compiling a "graph" of deferred GEMMs (fake kernels, real Inductor objects).

``python tests/inductor_deferred_worker.py --keys k1,k2 --out r.json --barrier DIR --parties N``:
each key becomes a MultiTemplateBuffer with two candidates; the scheduler's pre-fusion
pass (ours) claims and tunes, then every buffer is asked for its timings. Benchmarks
sleep ``--delay`` seconds so that concurrent processes interleave their claims.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--barrier", default=None)  # a directory, with --parties
    parser.add_argument("--parties", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.5)
    args = parser.parse_args()

    import inductor_fakes as fakes

    import tunecache

    tunecache.enable()
    benchmarked: list[list[str]] = []
    nodes = [
        fakes.deferred_node(
            "mm",
            f"[('cpu', 'torch.float32', {k})]",
            [f"aten_{k}", f"tmpl_{k}"],
            fakes.fake_benchmark(benchmarked, {f"tmpl_{k}": 0.5}, args.delay),
        )
        for k in args.keys.split(",")
    ]
    if args.barrier:
        import procs  # beside this script

        procs.file_barrier(Path(args.barrier), os.getpid(), args.parties)
    timings = fakes.run_scheduler(nodes)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(
            {"benchmarked": benchmarked, "timings": timings,
             "stats": tunecache.stats().gemm.as_dict()},
            f,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
