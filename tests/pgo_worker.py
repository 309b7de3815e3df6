"""One job that compiles a function at a few input sizes, for tests/test_pgo_sharing.py.

Run as ``python tests/pgo_worker.py --sizes 4,8 --out result.json --log tunecache.log``;
the caller sets TUNECACHE_* (the database, keys, TUNECACHE_PGO), TORCH_COMPILE_JOB_ID and
a TORCHINDUCTOR_CACHE_DIR of its own (a fresh one is a new node: Dynamo's local profile
lives under it). tunecache is activated by the environment, as in production. Each call
runs ``step`` on a tensor of (size, 3) and, with --y-sizes, a second input of (size,);
every graph Dynamo makes is compiled by Inductor, after its inputs are recorded: whether
any of their sizes is symbolic (a dimension compiled dynamic). The result: per graph, in
order, whether it is dynamic; Dynamo's count of graphs; the calls tunecache's stand-in
for Dynamo's remote PGO cache took; and what the profile service counted. Every record of
the ``tunecache`` logger, INFO and up, goes to --log, one line each as ``LEVEL message``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def step(x, y):  # type: ignore[no-untyped-def]
    return x * 2 + y.sum()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--y-sizes", default="")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    y_sizes = [int(s) for s in args.y_sizes.split(",")] if args.y_sizes else [5] * len(sizes)

    handler = logging.FileHandler(args.log, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("tunecache")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    # What `import torch` does with our entry point installed (torch/__init__.py,
    # _import_device_backends), whether or not this environment registered it.
    from tunecache import _autoload

    _autoload.torch_backend_entry()

    import torch
    from torch._dynamo.utils import counters
    from torch._inductor import remote_cache

    # What torch.compile(step) imports before its first frame, and what activates
    # tunecache (Inductor's autotuner module comes with it).
    from torch._inductor.compile_fx import compile_fx

    dynamic: list[bool] = []

    def backend(gm, example_inputs):  # type: ignore[no-untyped-def]
        values = [n.meta.get("example_value") for n in gm.graph.find_nodes(op="placeholder")]
        dynamic.append(any(
            isinstance(v, torch.SymInt)
            or (isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in v.shape))
            for v in values))
        return compile_fx(gm, example_inputs)

    compiled = torch.compile(step, backend=backend)
    for size, y_size in zip(sizes, y_sizes):
        out = compiled(torch.ones(size, 3), torch.ones(y_size))
        assert out.shape == (size, 3)

    from tunecache.inductor.state import REGISTRY

    share = REGISTRY.pgo
    stats = remote_cache.cache_stats._stats
    result = {
        "dynamic": dynamic,
        "unique_graphs": counters["stats"]["unique_graphs"],
        "remote": {name: {"hit": s.hit, "miss": s.miss, "put": s.put, "exception": s.exception}
                   for name, s in stats.items()},
        "pgo": None if share is None else dict(share.counts),
        "publishes": None if share is None else share.publishes,
        "remote_pgo": torch._dynamo.config.automatic_dynamic_remote_pgo,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
