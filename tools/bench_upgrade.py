"""After an upgrade, side by side with plain max-autotune, on CPU:

    python tools/bench_upgrade.py OUTDIR --new-python /venvs/t2141/bin/python \\
        [--new-python ...] [--age 2.12.0+cpu]

1. record: this interpreter's torch, tunecache on an empty SQLite database (the cluster
   before the upgrade);
2. for each --new-python (an interpreter of a virtual environment with a newer torch; this
   checkout is put first on its PYTHONPATH, so it imports this tunecache), in turn:
     default-V   the same job compiled in default mode (nothing autotuned): what any
                 compile costs, the floor no tuning cache goes below;
     plain-V     the same job with tunecache off (max-autotune, every GEMM tuned);
     upgraded-V  tunecache on a copy of the recorded database (the first job after the
                 upgrade: keys start from their entries under the older torch);
     again-V     the next job on that copy (hits);
     regret-V    `tunecache warm --exhaustive --json` on that copy under V: every entry
                 the upgrade carried, re-tuned in full, and its regret.
   With --age VERSION, the record is also relabelled as torch VERSION (tools/age_db.py)
   and the same three jobs run under this interpreter, tagged "aged".
--recorded DB starts from a database recorded before (a copy of it) instead of step 1.
Each job is a fresh process with its own Inductor cache directory; GEMM benchmarks are
Inductor's own "AUTOTUNE benchmarking" lines, counted in the job's log, so plain and
tunecache jobs are counted alike. Writes OUTDIR/bench.jsonl (one line per job) and
prints one line per job.

The job (``--job OUT.json``): a frozen MLP of LAYERS Linear layers of distinct sizes and
a bmm, compiled with mode="max-autotune-no-cudagraphs"; compile seconds are its first
call's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_BENCHMARKED = re.compile(r"AUTOTUNE benchmarking takes ([0-9.]+) seconds")
# Hidden sizes of the MLP: each Linear is its own GEMM key.
WIDTHS = (64, 96, 128, 160, 192, 224, 256)
AUTOTUNE = "max-autotune-no-cudagraphs"


def job(out: Path, mode: str) -> int:
    """One compiling process (see the module docstring)."""
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    import torch
    import torch._inductor.config as inductor_config

    enabled = False
    stats: dict[str, Any] = {}
    if os.environ.get("TUNECACHE_DB"):
        import tunecache

        enabled = tunecache.enable()
    torch.manual_seed(0)
    inductor_config.freezing = True
    layers = [torch.nn.Linear(a, b) for a, b in itertools.pairwise(WIDTHS)]
    model = torch.nn.Sequential(*[m for lin in layers for m in (lin, torch.nn.ReLU())]).eval()
    x = torch.randn(64, WIDTHS[0])
    a, b = torch.randn(4, 64, 48), torch.randn(4, 48, 40)
    with torch.no_grad():
        t0 = time.perf_counter()
        mlp = torch.compile(model, mode=mode)(x)
        bmm = torch.compile(lambda p, q: torch.bmm(p, q).relu(), mode=mode)(a, b)
        seconds = time.perf_counter() - t0
    if enabled:
        import tunecache

        stats = {k: v for k, v in tunecache.stats().gemm.as_dict().items() if k != "events"}
    out.write_text(json.dumps({
        "torch": str(torch.__version__), "tunecache": enabled, "compile_s": seconds,
        "checksum": [float(mlp.double().sum()), float(bmm.double().sum())], "stats": stats}))
    return 0


def _run(python: str, tag: str, outdir: Path, db: str | None,
         mode: str = AUTOTUNE) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TORCHINDUCTOR_CACHE_DIR"] = str(outdir / f"inductor-{tag}")
    if db is not None:
        env["TUNECACHE_DB"] = db
    log = outdir / f"{tag}.log"
    result = outdir / f"{tag}.json"
    with open(log, "w") as f:
        done = subprocess.run([python, __file__, "--job", str(result), "--mode", mode],
                              env=env,
                              stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{tag} failed; see {log}")
    benchmarks = [float(x) for x in _BENCHMARKED.findall(log.read_text(errors="replace"))]
    # What is left of the compile once GEMM benchmarks are gone: the floor of any job.
    line = {"tag": tag, **json.loads(result.read_text()),
            "gemm_benchmarks": len(benchmarks), "gemm_benchmark_s": round(sum(benchmarks), 2)}
    with open(outdir / "bench.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    print(f"{tag:14} torch {line['torch']:14} compile {line['compile_s']:7.1f} s  "
          f"GEMM benchmarks {line['gemm_benchmarks']:2} ({line['gemm_benchmark_s']:5.1f} s)  "
          f"transferred {line['stats'].get('transferred_keys', '-')}  "
          f"hits {line['stats'].get('hits', '-')}", flush=True)
    return line


def _regret(python: str, tag: str, outdir: Path, db: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TORCHINDUCTOR_CACHE_DIR"] = str(outdir / f"inductor-{tag}")
    done = subprocess.run([python, "-c", "import tunecache.cli as t; t.main()", "warm",
                           "--db", db, "--exhaustive", "--json"],
                          env=env, capture_output=True, text=True)
    (outdir / f"{tag}.json").write_text(done.stdout)
    (outdir / f"{tag}.log").write_text(done.stderr)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        print(f"{tag:14} warm --exhaustive exited {done.returncode}; see {tag}.log")
        return
    regrets = [t.get("regret") for t in report.get("tasks", report.get("entries", []))
               if isinstance(t, dict)]
    shown = ", ".join(f"{r:.3f}" for r in regrets if isinstance(r, (int, float)))
    print(f"{tag:14} warm --exhaustive exited {done.returncode}; regrets: {shown or '-'}")
    with open(outdir / "bench.jsonl", "a") as f:
        f.write(json.dumps({"tag": tag, "rc": done.returncode, "regrets": regrets}) + "\n")


def _upgrade(python: str, name: str, outdir: Path, recorded: Path) -> None:
    copy = outdir / f"db-{name}.sqlite"
    shutil.copy(recorded, copy)
    db = f"sqlite:///{copy}"
    _run(python, f"default-{name}", outdir, None, "default")
    _run(python, f"plain-{name}", outdir, None)
    _run(python, f"upgraded-{name}", outdir, db)
    _run(python, f"again-{name}", outdir, db)
    _regret(python, f"regret-{name}", outdir, db)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", nargs="?")
    p.add_argument("--new-python", action="append", default=[])
    p.add_argument("--age", default=None, help="also relabel the record as this torch")
    p.add_argument("--recorded", default=None, help="a recorded SQLite file to start from")
    p.add_argument("--job", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default=AUTOTUNE, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        return job(Path(args.job), args.mode)
    if not args.outdir:
        p.error("OUTDIR is required")
    outdir = Path(args.outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    recorded = outdir / "recorded.sqlite"
    if args.recorded:
        shutil.copy(args.recorded, recorded)
    else:
        _run(sys.executable, "record", outdir, f"sqlite:///{recorded}")
    for python in args.new_python:
        _upgrade(python, Path(python).parent.parent.name, outdir, recorded)
    if args.age:
        aged = outdir / "aged.sqlite"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT),
                                                            os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, str(ROOT / "tools" / "age_db.py"),
                        f"sqlite:///{recorded}", f"sqlite:///{aged}", "--torch", args.age],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        _upgrade(sys.executable, "aged", outdir, aged)
    return 0


if __name__ == "__main__":
    sys.exit(main())
