"""What an adversary or a library upgrade does to stored user-kernel entries, for a GPU run
of tools/bench_user_kernels_trust.sh:

    python tools/user_kernels_trust.py plant DB --kernel _dyt_
    python tools/user_kernels_trust.py upgrade SITE_DIR liger_kernel.ops.dyt _dyt_fwd_kernel

``plant``: every stored entry of a user kernel whose name contains ``--kernel`` gets one
config of its own kernel, changed the way someone with write access to the database may
change it, timed 1 µs so that it wins: in turn ``num_warps=64``, its first block size
times 2^20, and an unknown name (``EVIL``). Prints one JSON line: how many entries it
changed, and which way each. A job then reads each planted entry, refuses it with one
warning, and tunes that key as Triton would.

``upgrade``: a copy of the installed package that holds MODULE, under SITE_DIR, with a
comment line added inside KERNEL's body: what a library release that edits one kernel
looks like to Triton (the kernel's source, hence its ``cache_key``, changes; nothing it
computes does). Put SITE_DIR first on PYTHONPATH and that kernel is tuned again.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _hostile(config_id: str, way: str) -> str:
    config: dict[str, Any] = json.loads(config_id)
    if way == "warps":
        config["num_warps"] = 64
    elif way == "block":
        name = next((k for k in sorted(config) if not k.startswith("num_")
                     and isinstance(config[k], int)), None)
        if name is None:
            config["num_warps"] = 64
        else:
            config[name] = config[name] * 2 ** 20
    else:
        config["EVIL"] = 1
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def _execute(statement: Any, params: dict[str, Any], conn: Any) -> Any:
    return conn.execute(statement, params)


def plant(db: str, kernel: str) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from sqlalchemy import text

    import tunecache

    ways = ("warps", "block", "name")
    planted: list[dict[str, str]] = []
    with tunecache.open(db) as cache:
        rows = cache.store.db.run(lambda c: c.execute(text(
            "SELECT key_hash, op, timings_json FROM tunecache_entries "
            "WHERE kind = 'user_kernel' AND state = 'done' ORDER BY key_hash")).fetchall())
        for key_hash, op, timings_json in rows:
            if kernel not in (op or "") or not timings_json:
                continue
            timings = json.loads(timings_json)
            way = ways[len(planted) % len(ways)]
            timings[_hostile(next(iter(timings)), way)] = 1e-6
            update = {"t": json.dumps(timings), "h": key_hash}
            cache.store.db.run(functools.partial(_execute, text(
                "UPDATE tunecache_entries SET timings_json = :t WHERE key_hash = :h"),
                update), write=True)
            planted.append({"op": op, "way": way})
    return {"planted": len(planted), "entries": planted}


def upgrade(site: str, module: str, kernel: str) -> dict[str, Any]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{module} is not installed")
    top = module.split(".")[0]
    top_spec = importlib.util.find_spec(top)
    assert top_spec is not None and top_spec.submodule_search_locations
    installed = Path(next(iter(top_spec.submodule_search_locations)))
    copy = Path(site) / top
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(installed, copy)
    target = copy / Path(spec.origin).relative_to(installed)
    source = target.read_text()
    # The line after the kernel's signature: the first body line, whose indentation the
    # comment takes.
    found = re.search(rf"^def {re.escape(kernel)}\(.*?\):[^\n]*\n([ \t]+)", source,
                      re.MULTILINE | re.DOTALL)
    if found is None:
        raise SystemExit(f"no kernel {kernel} in {target}")
    at = found.end(1)
    target.write_text(source[:at] + "# edited by a library upgrade\n" + found.group(1)
                      + source[at:])
    return {"upgraded": f"{module}.{kernel}", "file": str(target)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    planting = sub.add_parser("plant")
    planting.add_argument("db")
    planting.add_argument("--kernel", required=True)
    upgrading = sub.add_parser("upgrade")
    upgrading.add_argument("site")
    upgrading.add_argument("module")
    upgrading.add_argument("kernel")
    args = p.parse_args()
    if args.command == "plant":
        print(json.dumps(plant(args.db, args.kernel)))
    else:
        print(json.dumps(upgrade(args.site, args.module, args.kernel)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
