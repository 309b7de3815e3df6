"""One process compiling one Triton kernel, as ``triton.compile`` drives its cache manager
(triton 3.6, compiler/compiler.py): ``get_group("<name>.json")``, and on a miss, ``put``
of each stage's file, then ``put_group``. Triton itself is not needed: the manager is
named by TRITON_CACHE_MANAGER and called through exactly these four methods. The
environment (TUNECACHE_*, TRITON_CACHE_DIR: this "node"'s local cache) says what it
shares.

    python kernel_worker.py KEY NAME SEED [BARRIER_DIR PARTIES]

SEED makes the compiled files (a real compile of the same kernel on another node gives
the same bytes; a different seed stands for different bytes). After compiling, the
process keeps the kernel as Inductor keeps a graph's kernel once its launcher is chosen
(``triton_cache.publish_kept``), unless KERNEL_WORKER_KEEPS=0 (a compile worker's part
alone). With BARRIER_DIR, the
process waits after its lookup until PARTIES processes have looked up: every one of them
missed and compiles. Prints one JSON line: outcome ("hit" or "compiled"), the sha256 of
each file Triton got, this process's kernel counts, and the files in its local directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import tunecache
from tunecache import triton_cache


def compiled_files(name: str, seed: str) -> dict[str, bytes]:
    body = hashlib.sha256(f"{name}/{seed}".encode()).digest() * 512
    return {f"{name}.source": f"def {name}(): pass  # {seed}\n".encode(),
            f"{name}.ptx": b"// ptx " + body[:2000],
            f"{name}.cubin": body,
            f"{name}.json": json.dumps({"name": name, "seed": seed}).encode()}


def main() -> None:
    key, name, seed = sys.argv[1:4]
    manager = triton_cache.KernelCacheManager(key)
    metadata = f"{name}.json"
    group = manager.get_group(metadata)
    if len(sys.argv) > 4:
        barrier, parties = Path(sys.argv[4]), int(sys.argv[5])
        (barrier / str(os.getpid())).touch()
        deadline = time.monotonic() + 60
        while len(list(barrier.iterdir())) < parties and time.monotonic() < deadline:
            time.sleep(0.01)
    if group is not None and metadata in group:
        outcome = "hit"
    else:
        outcome = "compiled"
        group = {}
        for filename, data in compiled_files(name, seed).items():
            if filename != metadata:
                group[filename] = manager.put(data, filename)
        group[metadata] = manager.put(compiled_files(name, seed)[metadata].decode(), metadata,
                                      binary=False)
        manager.put_group(metadata, group)
        if os.environ.get("KERNEL_WORKER_KEEPS", "1") == "1":
            triton_cache.publish_kept(key)
    local = sorted(str(p.relative_to(manager.cache_dir)) for p in
                   Path(manager.cache_dir).rglob("*") if p.is_file())
    print(json.dumps({
        "outcome": outcome,
        "files": {n: hashlib.sha256(Path(p).read_bytes()).hexdigest() for n, p in group.items()},
        "counts": {k: n for k, n in dataclasses.asdict(tunecache.stats().kernels).items() if n},
        "local": local,
    }))


if __name__ == "__main__":
    main()
