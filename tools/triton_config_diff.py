"""Which Triton kernels two jobs tuned to the same config.

    tunecache ls --json --kind triton_config --limit 1000 --db A.db > a.json
    tunecache ls --json --kind triton_config --limit 1000 --db B.db > b.json
    python tools/triton_config_diff.py a.json b.json [--recorded r.json] [--json]

Each file is a listing of one database's Triton entries. Keys present in both are compared
by the config each stored (its block sizes, warps and stages); with ``--recorded``, keys
also in that listing (the database both jobs started from) are left out, so that only
what the two jobs tuned themselves is compared. tools/bench_transfer.sh runs it on the
transfer job and its AHEAD variant: whether compiling candidates ahead changed what the
descents found, against how often two identical jobs disagree.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

CONFIG_FIELDS = ("XBLOCK", "YBLOCK", "ZBLOCK", "R0_BLOCK", "R1_BLOCK", "num_warps",
                 "num_stages")


def configs(listing: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """key hash -> (op, the stored config's fields) of a ``tunecache ls --json`` listing."""
    out = {}
    for entry in listing:
        best = json.loads(entry["best"]) if isinstance(entry.get("best"), str) else None
        if isinstance(best, dict):
            out[entry["key_hash"]] = (entry.get("op", ""),
                                      {f: best[f] for f in CONFIG_FIELDS if f in best})
    return out


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]],
            recorded: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    left, right = configs(a), configs(b)
    skip = set(configs(recorded or []))
    keys = sorted(k for k in left if k in right and k not in skip)
    differ = [{"key_hash": k, "op": left[k][0], "a": left[k][1], "b": right[k][1]}
              for k in keys if left[k][1] != right[k][1]]
    return {"compared": len(keys), "same": len(keys) - len(differ), "differ": differ}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--recorded", help="a listing whose keys are left out")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    def read(path: str) -> list[dict[str, Any]]:
        with open(path) as f:
            return list(json.load(f))

    result = compare(read(args.a), read(args.b), read(args.recorded) if args.recorded else None)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return 0
    print(f"{result['same']} of {result['compared']} kernels tuned to the same config")
    for d in result["differ"]:
        print(f"  {d['op']}: {d['a']} / {d['b']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
