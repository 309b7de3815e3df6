"""One rank of tests/test_fusion_decisions.py's two-process test, run as a script:
``fusion_decision_worker.py DB TMP INDEX``. Rank 0 measured a fusion at the site, rank 1
measured none; they wait for each other at a file barrier, settle at once, and each
prints the decision it runs as one JSON line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import procs
from test_fusion_decisions import FUSES, STAYS, _key, _sizes

import tunecache
from tunecache.inductor.triton import decisions


def main(db: str, tmp: str, index: int) -> None:
    cache = tunecache.open(db)
    ours = FUSES if index == 0 else STAYS
    procs.file_barrier(Path(tmp), index, 2)
    agreed = decisions.settle(cache, _key(4096), ours, _sizes(4096))
    cache.close()
    print(json.dumps({"rank": agreed.rank, "fused_ms": agreed.fused_ms}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
