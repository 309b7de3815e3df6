"""Make a database that looks like it was filled under an older torch (warm-command setup).

    python tools/age_db.py SRC DST --torch 2.10.0+cu130 [--kinds gemm,user_kernel]

Copies SRC's done entries into DST through `tunecache export` / `tunecache import`, with
the recorded torch version of every key of the named kinds replaced (import recomputes
each key's hash, so these are keys this torch never looks up); entries of other kinds are
copied unchanged. The default, GEMM keys only, is what tools/bench_gpu_suite.sh's
warm-command step needs (`tunecache warm` re-tunes GEMMs only): it shows that `tunecache
warm` alone turns the aged GEMM keys into this torch's. `--kinds gemm,user_kernel,
triton_config` ages every kind a job's upgrade path starts from. A Triton config key keeps
Inductor's own key of the kernel (which hashes torch's sources, so a real upgrade changes
it too; the upgrade path does not match by it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--torch", required=True, help="the torch version to record the keys under")
    p.add_argument("--kinds", default="gemm",
                   help="comma-separated kinds of keys to relabel (default: gemm)")
    args = p.parse_args()
    export = subprocess.run([sys.executable, "-m", "tunecache.cli", "export", "--db", args.src],
                            check=True, capture_output=True, text=True).stdout
    kinds = set(args.kinds.split(","))
    out = []
    for line in export.splitlines():
        entry = json.loads(line)
        key = entry.get("key")
        if isinstance(key, dict) and key.get("kind") in kinds:
            key["env"] = {**key["env"], "torch": args.torch}
            entry.pop("key_hash", None)
        out.append(json.dumps(entry))
    done = subprocess.run([sys.executable, "-m", "tunecache.cli", "import", "--db", args.dst,
                           "--json", "-"], input="\n".join(out) + "\n", text=True)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
