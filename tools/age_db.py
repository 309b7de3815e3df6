"""Make a database that looks like it was filled under an older torch (warm-command setup).

    python tools/age_db.py SRC DST --torch 2.10.0+cu130

Copies SRC's done entries into DST through `tunecache export` / `tunecache import`, with
every GEMM key's recorded torch version replaced (import recomputes each key's hash, so
these are keys this torch never looks up). Triton config entries are copied unchanged
(`tunecache warm` re-tunes GEMMs only; a job after an upgrade re-tunes its Triton kernels
itself). tools/bench_gpu_suite.sh's warm-command step then shows that `tunecache warm`
alone turns the aged GEMM keys into this torch's.
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
    p.add_argument("--torch", required=True, help="the torch version to record GEMM keys under")
    args = p.parse_args()
    export = subprocess.run([sys.executable, "-m", "tunecache.cli", "export", "--db", args.src],
                            check=True, capture_output=True, text=True).stdout
    out = []
    for line in export.splitlines():
        entry = json.loads(line)
        key = entry.get("key")
        if isinstance(key, dict) and key.get("kind") == "gemm":
            key["env"] = {**key["env"], "torch": args.torch}
            entry.pop("key_hash", None)
        out.append(json.dumps(entry))
    done = subprocess.run([sys.executable, "-m", "tunecache.cli", "import", "--db", args.dst,
                           "--json", "-"], input="\n".join(out) + "\n", text=True)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
