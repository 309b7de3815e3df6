"""PyTorch's own tests as a compatibility check: the same outcomes with tunecache and without.

    python tools/pytorch_tests.py --torch-src DIR [-k EXPR] [--files F ...] [--json]

DIR is a PyTorch source tree (or just the test files and the helper modules they import,
at the installed torch's version: PyTorch's code is read where the user has it, never
copied here). Each test file runs three ways, each in its own pytest process with a fresh
TORCHINDUCTOR_CACHE_DIR: without tunecache (``plain``: no TUNECACHE_* at all), with
TUNECACHE_DB (``db``, a fresh SQLite file: tunecache activates itself through its
torch.backends entry point) and with TUNECACHE_DB and a signing key (``key``: compiled
graphs, kernels and shape profiles shared too). Outcomes come from pytest's JUnit XML;
every test whose outcome is not the same in all three is listed (a file that crashed or
ran out of time counts as one outcome for the whole file). Exit status 1 if any differs.

``-k`` is pytest's; ``--timeout`` bounds each pytest process (seconds). The default files
are those issue 51 names (CPU tests).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

DEFAULT_FILES = ("test/inductor/test_cpu_select_algorithm.py", "test/inductor/test_codecache.py",
                 "test/dynamo/test_pgo.py", "test/inductor/test_remote_cache.py")
MODES = ("plain", "db", "key")
REPO = Path(__file__).resolve().parents[1]


def outcomes_of(junit: str, file: str) -> dict[str, str]:
    """``{test id: outcome}`` from one JUnit XML report; outcome is passed, failed, error
    or skipped, and the id ``FILE::class::name``."""
    root = ET.fromstring(junit)
    found: dict[str, str] = {}
    for case in root.iter("testcase"):
        classname = case.get("classname", "").rsplit(".", 1)[-1]
        test = f"{file}::{classname}::{case.get('name', '')}" if classname else \
            f"{file}::{case.get('name', '')}"
        kinds = {child.tag for child in case}
        if "error" in kinds:
            outcome = "error"
        elif "failure" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A test reported twice (a teardown error after a pass) keeps its worse outcome.
        if found.get(test) not in ("error", "failed"):
            found[test] = outcome
    return found


def differences(runs: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """Every test whose outcome is not the same in every mode of ``runs`` ({mode: {test:
    outcome}}); a test a mode did not report is ``absent`` there."""
    tests = sorted(set().union(*runs.values())) if runs else []
    out = []
    for test in tests:
        seen = {mode: outcomes.get(test, "absent") for mode, outcomes in runs.items()}
        if len(set(seen.values())) > 1:
            out.append({"test": test, "outcomes": seen})
    return out


def counts(runs: dict[str, dict[str, str]]) -> dict[str, dict[str, int]]:
    return {mode: dict(sorted(Counter(outcomes.values()).items()))
            for mode, outcomes in runs.items()}


def _env(mode: str, work: Path, python_path: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_CACHE_DIR"))}
    cache_dir = work / mode / "inductor"
    cache_dir.mkdir(parents=True, exist_ok=True)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [python_path, env.get("PYTHONPATH")]))
    if mode in ("db", "key"):
        env["TUNECACHE_DB"] = str(work / mode / "tune.db")
    if mode == "key":
        env["TUNECACHE_SIGNING_KEY"] = str(work / "keys" / "tunecache-signing.key")
    return env


def run_file(python: str, torch_src: Path, file: str, mode: str, work: Path, keyword: str | None,
             timeout: float, python_path: str) -> dict[str, str]:
    """One test file in one mode: its outcomes (the whole file as one ``crashed`` or
    ``timeout`` outcome where pytest wrote no report)."""
    (work / mode).mkdir(parents=True, exist_ok=True)
    report = work / mode / (file.replace("/", "__") + ".xml")
    cmd = [python, "-m", "pytest", str(torch_src / file), "-q", "-p", "no:cacheprovider",
           f"--junitxml={report}", "-o", "junit_family=xunit1"]
    if keyword:
        cmd += ["-k", keyword]
    log = work / mode / (file.replace("/", "__") + ".log")
    with open(log, "w", encoding="utf-8") as out:
        try:
            done = subprocess.run(cmd, env=_env(mode, work, python_path), cwd=torch_src,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {f"{file}::*": "timeout"}
    if not report.exists():
        return {f"{file}::*": f"crashed (exit {done.returncode})"}
    return outcomes_of(report.read_text(encoding="utf-8"), file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-src", required=True, type=Path,
                        help="a PyTorch source tree (its test/ directory is read)")
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES),
                        help="test files, relative to --torch-src")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest's -k expression")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="which of plain,db,key to run (default: all three)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds for each pytest process")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--work", type=Path, default=None,
                        help="where reports, logs and databases go (default: a temporary "
                             "directory, kept)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    torch_src = args.torch_src.resolve()
    missing = [f for f in args.files if not (torch_src / f).is_file()]
    if missing:
        parser.error(f"not in {torch_src}: {', '.join(missing)}")
    work = (args.work or Path(tempfile.mkdtemp(prefix="tunecache-pytorch-tests-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if "key" in modes:
        sys.path.insert(0, str(REPO))
        from tunecache.core.signing import write_key_pair

        if not (work / "keys").exists():
            write_key_pair(work / "keys")
    runs: dict[str, dict[str, str]] = {mode: {} for mode in modes}
    for file in args.files:
        for mode in modes:
            runs[mode].update(run_file(args.python, torch_src, file, mode, work, args.keyword,
                                       args.timeout, str(REPO)))
    diff = differences(runs)
    result = {"torch_src": str(torch_src), "files": args.files, "keyword": args.keyword,
              "modes": modes, "work": str(work), "counts": counts(runs), "differences": diff}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for mode in modes:
            line = ", ".join(f"{n} {outcome}" for outcome, n in result["counts"][mode].items())
            print(f"{mode:<6} {line or 'no tests'}")
        if diff:
            print(f"{len(diff)} test(s) differ:")
            for d in diff:
                print(f"  {d['test']}: " + ", ".join(f"{m} {o}" for m, o in d["outcomes"].items()))
        else:
            print("no test differs")
        print(f"reports and logs: {work}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
