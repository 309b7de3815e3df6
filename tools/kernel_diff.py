"""Which kernels of one compiled graph are found again in another, and why the others are not.

    python tools/kernel_diff.py dump INDUCTOR_CACHE_DIR OUT.json [--stored KEYS.json]
    python tools/kernel_diff.py diff OLD.json NEW.json

``dump`` reads a job's Inductor cache directory (every rank's TORCHINDUCTOR_CACHE_DIR keeps
the wrapper code of the graphs it compiled and Triton's cache under ``triton/``) and writes:

- ``final``: the Triton kernels of the job's final graphs, name -> source, read from the
  wrapper modules (``name = async_compile.triton('name', '''source''', ...)``); kernels
  compiled only to be benchmarked are not in a wrapper;
- ``benchmarked``: the modules Inductor generated only to time them (a fusion candidate,
  a mix-order reduction's split size: a kernel with a benchmark harness), file -> source;
- ``triton``: Triton's cache, key -> kernel name (each key directory's metadata file);
- ``stored`` (with ``--stored``, the JSON of ``tunecache ls --kind kernel --json`` taken
  before the job): which of those keys were in the database, i.e. could be loaded.

``diff`` prints, for the new job's final kernels: found in the old job's final graphs by
name (same source, so same name: tunecache names kernels by content), and for each one that
is not, the old kernel of the same descriptive name (the part before the content suffix)
whose source is nearest, as a unified diff. Then the new job's benchmarked modules whose
tunecache key (the kernel's identity in :mod:`tunecache.inductor.triton.kernel_keys`) no old
module has, with the nearest old one's diff; then the new job's Triton keys that were not
in the database, by kernel name: what the job compiled rather than loaded.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

_KERNEL = re.compile(r"(\w+) = async_compile\.triton\('(\w+)', '''(.*?)''', device_str=",
                     re.DOTALL)


def _modules(root: Path) -> tuple[list[str], dict[str, str]]:
    """The job's wrapper modules' sources, and its benchmarked modules by file name."""
    wrappers, benchmarked = [], {}
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if "async_compile.wait(globals())" in text and "def call(" in text:
            wrappers.append(text)
        elif "def get_args():" in text and "@triton.jit" in text:
            benchmarked[path.name] = text
    return wrappers, benchmarked


def dump(root: Path, stored: Path | None) -> dict[str, Any]:
    final: dict[str, str] = {}
    wrappers, benchmarked = _modules(root)
    for wrapper in wrappers:
        for _, name, source in _KERNEL.findall(wrapper):
            final[name] = source
    triton: dict[str, str] = {}
    for meta in (root / "triton").rglob("*.json"):
        if meta.name.startswith("__grp__"):
            continue
        try:
            value = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            triton[meta.parent.name] = value["name"]
    out: dict[str, Any] = {"final": final, "triton": triton, "benchmarked": benchmarked,
                           "wrappers": len(wrappers)}
    if stored is not None:
        rows = json.loads(stored.read_text() or "[]")
        keys = {r["key"] for r in rows if isinstance(r, dict) and r.get("kind") == "kernel"}
        out["stored"] = sorted(k for k in triton if k in keys)
    return out


def _stem(name: str) -> str:
    return re.sub(r"_[0-9a-f]{16}$|_\d+$", "", name)


def _likeness(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def _benchmarked(old: dict[str, str], new: dict[str, str]) -> None:
    from tunecache.inductor.triton.kernel_keys import triton_kernel_info

    def identity(source: str) -> str:
        return str(triton_kernel_info(source, {})["kernel"])

    old_keys = {identity(s) for s in old.values()}
    missing = [name for name, s in new.items() if identity(s) not in old_keys]
    print(f"\nnew job's benchmarked modules: {len(new)}; whose key no old one has: "
          f"{len(missing)}")
    for name in missing[:3]:
        nearest = max(old, key=lambda n: _likeness(old[n], new[name]), default=None)
        if nearest is not None:
            print("\n".join(difflib.unified_diff(old[nearest].splitlines(),
                                                  new[name].splitlines(), nearest, name,
                                                  lineterm="", n=1)))


def diff(old: dict[str, Any], new: dict[str, Any]) -> None:
    found = [n for n in new["final"] if n in old["final"]]
    missing = [n for n in new["final"] if n not in old["final"]]
    print(f"new job's final kernels: {len(new['final'])}; found by name in the old job's "
          f"final graphs: {len(found)}; not found: {len(missing)}")
    for name in missing:
        source = new["final"][name].replace(name, "KERNEL")
        same_stem = [n for n in old["final"] if _stem(n) == _stem(name)]
        print(f"\n== {name}: {len(same_stem)} old kernel(s) of the same descriptive name")
        if not same_stem:
            continue

        nearest = max(same_stem, key=lambda n: _likeness(old["final"][n].replace(n, "KERNEL"),
                                                          source))
        lines = difflib.unified_diff(old["final"][nearest].replace(nearest, "KERNEL")
                                     .splitlines(), source.splitlines(), nearest, name,
                                     lineterm="", n=1)
        print("\n".join(lines))
    _benchmarked(old.get("benchmarked", {}), new.get("benchmarked", {}))
    if "stored" in new:
        stored = set(new["stored"])
        compiled = sorted((name, key) for key, name in new["triton"].items()
                          if key not in stored)
        print(f"\nTriton keys in the new job: {len(new['triton'])}, of which in the database "
              f"before it: {len(stored)}; compiled here:")
        for name, key in compiled:
            where = "final" if name in new["final"] else "not final"
            print(f"  {name} {key[:16]} ({where}; in the old job's final graphs: "
                  f"{name in old['final']}, old job's Triton keys for this name: "
                  f"{sum(1 for n in old['triton'].values() if n == name)})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump")
    d.add_argument("root", type=Path)
    d.add_argument("out", type=Path)
    d.add_argument("--stored", type=Path, default=None)
    c = sub.add_parser("diff")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    args = p.parse_args()
    if args.command == "dump":
        args.out.write_text(json.dumps(dump(args.root, args.stored)))
        return 0
    diff(json.loads(args.old.read_text()), json.loads(args.new.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
