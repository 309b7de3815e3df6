"""One job that compiles a training step with tunecache on, for tests/test_graph_sharing.py.

Run as ``python tests/graph_share_worker.py --out result.json --log tunecache.log``; the
caller sets TUNECACHE_* (the database, keys) and a TORCHINDUCTOR_CACHE_DIR of its own (a
fresh one is a new node), with Inductor's FX graph and AOTAutograd caches on. It compiles
a forward and backward (an MLP whose weights need gradients, so AOTAutograd builds both
graphs; one MLP per --widths value, so a job can bring a graph nobody published) and
writes Inductor's cache counters, the remote-cache statistics of the classes tunecache
stands in for, what the graph service counted, and each MLP's loss and gradients
(to compare jobs). Every record of the ``tunecache`` logger, INFO and up, goes to --log, one
line each as ``LEVEL message``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--widths", type=lambda text: [int(w) for w in text.split(",")],
                        default=[64], help="one model (its hidden width) per compiled step")
    parser.add_argument("--autoload", action="store_true",
                        help="activate through the torch.backends entry point, not enable()")
    args = parser.parse_args()

    handler = logging.FileHandler(args.log, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("tunecache")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    if args.autoload:
        # What `import torch` does with our entry point installed (torch/__init__.py,
        # _import_device_backends): tunecache enables itself once Inductor's autotuner
        # module is imported, in the middle of the first compile's imports.
        from tunecache import _autoload

        _autoload.torch_backend_entry()

    import torch
    from torch._dynamo.utils import counters
    from torch._functorch._aot_autograd import autograd_cache
    from torch._inductor import remote_cache

    import tunecache
    from tunecache.inductor.state import REGISTRY

    enabled = tunecache.enable() if not args.autoload else None
    outputs = []
    for width in args.widths:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(),
                                    torch.nn.Linear(width, 16))
        step = torch.compile(lambda x, m=model: m(x).square().mean(),
                             mode="max-autotune-no-cudagraphs")
        loss = step(torch.randn(8, 32, generator=torch.Generator().manual_seed(1)))
        loss.backward()
        outputs.append({"loss": loss.item(),
                        "grads": [p.grad.flatten().tolist() for p in model.parameters()]})
    import torch._dynamo.config
    import torch._functorch.config
    import torch._inductor.config

    share = REGISTRY.graphs
    if enabled is None:
        enabled = tunecache.is_enabled()
    result = {
        "enabled": enabled,
        "inductor": dict(counters["inductor"]),
        "aot_autograd": dict(counters["aot_autograd"]),
        # Inductor's per-class counts of remote-cache gets and puts (remote_cache.py)
        "remote": {name: {"hit": s.hit, "miss": s.miss, "put": s.put, "exception": s.exception}
                   for name, s in remote_cache.cache_stats._stats.items()},
        "graphs": None if share is None else dict(share.counts),
        "publishes": None if share is None else share.publishes,
        "outputs": outputs,
        # torch's remote-cache flags as the job ran with them (a user's False is kept)
        "flags": {name: getattr(owner, name) for owner, name in (
            (torch._inductor.config, "fx_graph_remote_cache"),
            (torch._functorch.config, "enable_remote_autograd_cache"),
            (torch._inductor.config, "autotune_remote_cache"),
            (torch._dynamo.config, "automatic_dynamic_remote_pgo"))},
        # whether torch goes through the remote AOTAutograd cache
        "remote_autograd": autograd_cache.should_use_remote_autograd_cache(),
        "parts": tunecache.switch.parts_on(),
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
