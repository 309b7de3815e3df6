"""One training step compiled with every tunecache hook installed, for the FX graph cache test.

Run as ``python tests/graph_cache_worker.py --out result.json``; the caller sets TUNECACHE_*
and a TORCHINDUCTOR_CACHE_DIR that two runs share, with Inductor's FX graph and AOTAutograd
caches left on. It compiles a forward and backward (an MLP whose weights need gradients,
so AOTAutograd builds both graphs) and writes Inductor's own cache counters as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import torch
    from torch._dynamo.utils import counters

    import tunecache

    enabled = tunecache.enable()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    step = torch.compile(lambda x: model(x).square().mean(), mode="max-autotune-no-cudagraphs")
    step(torch.randn(8, 32)).backward()
    result = {
        "enabled": enabled,
        "inductor": dict(counters["inductor"]),
        "aot_autograd": dict(counters["aot_autograd"]),
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
