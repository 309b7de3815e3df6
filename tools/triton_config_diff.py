"""Which Triton kernels two jobs tuned to the same config, and how long each took.

    tunecache ls --json --kind triton_config --limit 1000 --db A.db > a.json
    tunecache ls --json --kind triton_config --limit 1000 --db B.db > b.json
    python tools/triton_config_diff.py a.json b.json [--recorded r.json] [--json]

Each file is a listing of one database's Triton entries. Keys present in both are compared
by the config each stored (its block sizes, warps and stages); with ``--recorded``, keys
also in that listing (the database both jobs started from) are left out, so that only
what the two jobs tuned themselves is compared. Each compared kernel's tuning seconds
(the entry's ``tune_seconds``: the time Inductor counted for tuning the kernel, its
configs' benchmark and its coordinate descent or transfer) are listed for both jobs,
longest first, with their totals.
tools/bench_transfer.sh runs it on the transfer job and its AHEAD variant: whether
compiling candidates ahead changed what the descents found, against how often two
identical jobs disagree, and which kernels' tuning it shortened.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from tunecache.files import read_regular

CONFIG_FIELDS = ("XBLOCK", "YBLOCK", "ZBLOCK", "R0_BLOCK", "R1_BLOCK", "num_warps",
                 "num_stages")
# A listing of `tunecache ls --limit 1000` is under 1 MiB; far larger is not one.
MAX_LISTING_BYTES = 64 << 20


def read_listing(path: str) -> list[dict[str, Any]]:
    """The entries of a listing file (a regular file of at most MAX_LISTING_BYTES)."""
    data, _ = read_regular(path, MAX_LISTING_BYTES + 1, follow_symlinks=True)
    if len(data) > MAX_LISTING_BYTES:
        raise ValueError(f"{path}: over {MAX_LISTING_BYTES} bytes, not a listing")
    listing = json.loads(data)
    if not isinstance(listing, list) or not all(isinstance(e, dict) for e in listing):
        raise ValueError(f"{path}: not a `tunecache ls --json` listing")
    return listing


def configs(listing: list[dict[str, Any]]
            ) -> dict[str, tuple[str, dict[str, Any], float | None]]:
    """key hash -> (op, the stored config's fields, its tuning seconds or None) of a
    ``tunecache ls --json`` listing."""
    out = {}
    for entry in listing:
        best = json.loads(entry["best"]) if isinstance(entry.get("best"), str) else None
        if isinstance(best, dict) and isinstance(entry.get("key_hash"), str):
            out[entry["key_hash"]] = (str(entry.get("op", "")),
                                      {f: best[f] for f in CONFIG_FIELDS if f in best},
                                      _seconds(entry.get("tune_seconds")))
    return out


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]],
            recorded: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    left, right = configs(a), configs(b)
    skip = set(configs(recorded or []))
    keys = sorted(k for k in left if k in right and k not in skip)
    differ = [{"key_hash": k, "op": left[k][0], "a": left[k][1], "b": right[k][1]}
              for k in keys if left[k][1] != right[k][1]]
    keys_by_seconds = sorted(keys, key=lambda k: -max(left[k][2] or 0.0, right[k][2] or 0.0))
    seconds = [{"key_hash": k, "op": left[k][0], "a": left[k][2], "b": right[k][2]}
               for k in keys_by_seconds]
    totals = {"a": round(sum(left[k][2] or 0.0 for k in keys), 3),
              "b": round(sum(right[k][2] or 0.0 for k in keys), 3)}
    return {"compared": len(keys), "same": len(keys) - len(differ), "differ": differ,
            "tune_seconds": totals, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--recorded", help="a listing whose keys are left out")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    try:
        result = compare(read_listing(args.a), read_listing(args.b),
                         read_listing(args.recorded) if args.recorded else None)
    except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        print(f"triton_config_diff: {e}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return 0
    print(f"{result['same']} of {result['compared']} kernels tuned to the same config")
    for d in result["differ"]:
        print(f"  {d['op']}: {d['a']} / {d['b']}")
    totals = result["tune_seconds"]
    print(f"tuning seconds: {totals['a']:.2f} / {totals['b']:.2f}")
    for s in result["seconds"]:
        print(f"  {s['op']}: {_shown(s['a'])} / {_shown(s['b'])}")
    return 0


def _shown(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


if __name__ == "__main__":
    sys.exit(main())
