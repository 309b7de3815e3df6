"""Hostile stored Triton configs on a GPU: does the job still finish, with eager's numerics?

    python tools/hostile_triton.py --db /tmp/hostile.db            # SQLite file, must not exist
    python tools/hostile_triton.py --db postgresql://user@host/db  # no Triton entries in it
    python tools/hostile_triton.py --db /tmp/h.db --cases num_warps_64,blocks_2_20 --out h.jsonl

First a seed job compiles a small model (GEMM, pointwise, reductions) with
``torch.compile(mode="max-autotune-no-cudagraphs")`` (coordinate descent on) and tunecache
on a fresh database, so every Triton kernel's best config is stored (kind
``triton_config``). Then, for each case, every stored Triton config is rewritten in the
database (one hostile change, the same for all kernels), a fresh process (fresh
TORCHINDUCTOR_CACHE_DIR, FX graph and AOTAutograd caches off) compiles and runs the same
model, and the stored configs are put back. Each case reports whether the job finished,
the largest difference from eager, and the tunecache warnings it printed (compile workers'
included: they write to the same stderr). ``expect`` says what should happen:
``refused`` (tunecache refuses the entry at the kernel's load, one warning per reason),
``fallback`` (passes validation, then fails to compile or launch on the GPU: Inductor
tunes the kernel, one warning), ``used`` (a config the kernel may run).

Prints one JSON line per case (also appended to ``--out``), then a table. Exit 0 when
every case finished and matched eager. Needs a CUDA GPU with Triton, torch 2.11-2.14
and tunecache's dependencies; run from a checkout (the tool puts it first on the path).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# Inductor's block-size constexprs (XBLOCK ... R1_BLOCK; combo kernels add _0, _1 ...).
BLOCK = re.compile(r"^(X|Y|Z|R0_|R1_)BLOCK(_\d+)?$")
Mutation = Callable[[dict[str, Any]], dict[str, Any]]


def _blocks(value: Any) -> Mutation:
    def mutate(entry: dict[str, Any]) -> dict[str, Any]:
        return {k: (value if BLOCK.match(k) else v) for k, v in entry.items()}

    return mutate


def _first_block(value: Any) -> Mutation:
    """The first block size (XBLOCK where there is one) set to ``value``."""

    def mutate(entry: dict[str, Any]) -> dict[str, Any]:
        names = sorted((k for k in entry if BLOCK.match(k)), key=lambda k: (k != "XBLOCK", k))
        return {**entry, names[0]: value} if names else entry

    return mutate


def _over_numel(entry: dict[str, Any]) -> dict[str, Any]:
    """Each block at Inductor's own per-dimension limit: every value passes validation,
    but with two dimensions the block exceeds Triton's 2**20 elements, which Triton
    refuses to compile (the fallback path)."""
    limits = {"X": 4096, "Y": 1024, "Z": 1024, "R0_": 65536, "R1_": 32768}
    out = dict(entry)
    for k in entry:
        m = BLOCK.match(k)
        if m:
            out[k] = limits[m.group(1)]
    return out


def _tiny(entry: dict[str, Any]) -> dict[str, Any]:
    out = {k: (1 if BLOCK.match(k) else v) for k, v in entry.items()}
    for k in ("R0_BLOCK", "R1_BLOCK"):
        if k in out:
            out[k] = 2
    return out


# name -> (what it does to each stored config, what should happen)
CASES: dict[str, tuple[Mutation, str]] = {
    "baseline": (lambda e: e, "used"),
    "num_warps_64": (lambda e: {**e, "num_warps": 64}, "refused"),
    "num_warps_12": (lambda e: {**e, "num_warps": 12}, "refused"),
    "num_warps_string": (lambda e: {**e, "num_warps": "4"}, "refused"),
    "blocks_2_20": (_blocks(1 << 20), "refused"),
    "unknown_constexpr": (lambda e: {**e, "TUNECACHE_HOSTILE": 1}, "refused"),
    "block_zero": (_first_block(0), "refused"),
    "block_negative": (_first_block(-64), "refused"),
    "block_not_pow2": (_first_block(48), "refused"),
    "block_string": (_first_block("64"), "refused"),
    "block_float": (_first_block(64.0), "refused"),
    "block_bool": (_first_block(True), "refused"),
    "num_stages_1000": (lambda e: {**e, "num_stages": 1000}, "refused"),
    "num_stages_negative": (lambda e: {**e, "num_stages": -1}, "refused"),
    "blocks_over_numel": (_over_numel, "fallback"),
    "tiny_blocks": (_tiny, "used"),
    "num_stages_16": (lambda e: {**e, "num_stages": 16}, "used"),
    "num_warps_32": (lambda e: {**e, "num_warps": 32}, "used"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="a fresh SQLite path, or a PostgreSQL URL")
    p.add_argument("--cases", default="all",
                   help=f"comma-separated, or 'all': {', '.join(CASES)}")
    p.add_argument("--out", default=None, help="JSON lines file to append the results to")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: a smoke test of the tool itself (Triton configs need a GPU)")
    p.add_argument("--mode", default="max-autotune-no-cudagraphs", help="torch.compile mode")
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--atol", type=float, default=1e-3)
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--timeout", type=int, default=1800, help="seconds per job")
    p.add_argument("--keep", action="store_true",
                   help="leave the hostile rewrite of the last case in the database")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a job's report path
    args = p.parse_args(argv)
    names = list(CASES) if args.cases == "all" else [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        p.error(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(CASES)}")
    args.case_names = names
    return args


# ----------------------------------------------------------------------------- the job


def build_model(torch: Any, dim: int) -> Any:
    nn = torch.nn
    Module: Any = nn.Module  # torch is untyped here: a base class of type Any

    class Small(Module):
        """A GEMM (a template under max-autotune), pointwise ops and reductions."""

        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(dim, dim)
            self.norm = nn.LayerNorm(dim)

        def forward(self, x: Any) -> Any:
            h = torch.nn.functional.gelu(self.lin(x))
            h = self.norm(h + x)
            return torch.softmax(h, dim=-1) * h.sum(dim=-1, keepdim=True) / dim

    return Small()


def child(args: argparse.Namespace) -> int:
    """One job: compile and run the model with tunecache; write a JSON report."""
    import logging

    sys.path.insert(0, str(REPO))
    import torch

    import tunecache

    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    logging.getLogger("tunecache").addHandler(Collect())
    report: dict[str, Any] = {"finished": False}
    enabled = tunecache.enable()
    report["tunecache_enabled"] = bool(enabled)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model(torch, args.dim).to(device)
    x = torch.randn(args.rows, args.dim, device=device)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, mode=args.mode)
        t0 = time.perf_counter()
        out = compiled(x)
        again = compiled(x)  # a second launch of every kernel
        if device.type == "cuda":
            torch.cuda.synchronize()
    report["compile_and_run_seconds"] = round(time.perf_counter() - t0, 2)
    report["max_abs_error"] = max(float((out - eager).abs().max()),
                                  float((again - eager).abs().max()))
    report["matches_eager"] = bool(torch.allclose(out, eager, atol=args.atol, rtol=args.rtol)
                                   and torch.allclose(again, eager, atol=args.atol,
                                                      rtol=args.rtol))
    report["triton"] = {k: v for k, v in tunecache.stats().triton.as_dict().items()
                        if k in ("lookups", "hits", "misses", "invalid", "stored_config_failed",
                                 "puts", "published", "adopted", "coordesc_restored")}
    # Inductor's own cache counters, reported with every run.
    from torch._dynamo.utils import counters

    report["inductor_counters"] = {
        group: {k: v for k, v in counters[group].items() if "cache" in k}
        for group in ("inductor", "aot_autograd")}
    report["warnings"] = warnings
    report["finished"] = True
    Path(args.child).write_text(json.dumps(report))
    return 0


def run_job(args: argparse.Namespace, label: str, work: Path) -> dict[str, Any]:
    """Run one job in a fresh process; what it reported, its exit code and warnings."""
    report_path = work / f"{label}.json"
    inductor_dir = tempfile.mkdtemp(prefix=f"inductor-{label}-", dir=work)
    env = dict(os.environ)
    env.update({
        "TUNECACHE_DB": args.db,
        "TORCHINDUCTOR_CACHE_DIR": inductor_dir,
        "TRITON_CACHE_DIR": os.path.join(inductor_dir, "triton"),
        # A graph-cache hit would skip the kernel loads this is about.
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    })
    env.pop("TUNECACHE_MODE", None)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--db", args.db, "--child",
           str(report_path), "--device", args.device, "--mode", args.mode,
           "--rows", str(args.rows), "--dim", str(args.dim), "--atol", str(args.atol),
           "--rtol", str(args.rtol)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
        rc: int | str = proc.returncode
        stderr = proc.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        stderr = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes)
                  else str(e.stderr or ""))
    result: dict[str, Any] = {"finished": False}
    if report_path.exists():
        result = json.loads(report_path.read_text())
    result["returncode"] = rc
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    # Every tunecache warning line on stderr, the compile workers' included (theirs do
    # not reach the job's logging handler).
    lines = [ln.strip() for ln in stderr.splitlines() if "tunecache:" in ln]
    result["stderr_warnings"] = sorted(set(ln[ln.index("tunecache:"):] for ln in lines))
    if not result["finished"]:
        result["stderr_tail"] = stderr[-3000:]
    return result


# ---------------------------------------------------------------------- the database


def open_cache(db: str) -> Any:
    sys.path.insert(0, str(REPO))
    import tunecache

    cache = tunecache.open(db)
    cache.lookup({"kind": "hostile_triton", "op": "none"})  # creates the schema if new
    return cache


def triton_rows(cache: Any) -> dict[str, tuple[str, str | None]]:
    """key_hash -> (timings_json, best) of every done triton_config entry."""
    from sqlalchemy import select

    from tunecache.store.schema import entries

    def work(conn: Any) -> dict[str, tuple[str, str | None]]:
        rows = conn.execute(select(entries.c.key_hash, entries.c.timings_json, entries.c.best)
                            .where(entries.c.kind == "triton_config")
                            .where(entries.c.state == "done"))
        return {r.key_hash: (r.timings_json, r.best) for r in rows}

    return cache.store.db.run(work)


def write_rows(cache: Any, rows: dict[str, tuple[str, str | None]]) -> None:
    from sqlalchemy import update

    from tunecache.store.schema import entries

    def work(conn: Any) -> None:
        for key_hash, (timings_json, best) in rows.items():
            conn.execute(update(entries).where(entries.c.key_hash == key_hash)
                         .values(timings_json=timings_json, best=best))

    cache.store.db.run(work, write=True)


def hostile_rows(rows: dict[str, tuple[str, str | None]], mutate: Mutation
                 ) -> dict[str, tuple[str, str | None]]:
    """Each stored config rewritten by ``mutate`` (the entry's one candidate is the
    canonical JSON of Inductor's saved dict; its timing is kept)."""
    from tunecache.keys import canonical_json

    out: dict[str, tuple[str, str | None]] = {}
    for key_hash, (timings_json, _) in rows.items():
        timings = json.loads(timings_json)
        if len(timings) != 1:
            continue
        ((name, ms),) = timings.items()
        try:
            entry = json.loads(name)
        except ValueError:
            continue
        new = canonical_json(mutate(dict(entry)))
        out[key_hash] = (json.dumps({new: ms}), new)
    return out


# ------------------------------------------------------------------------------ main


def summarize(case: str, expect: str, job: dict[str, Any]) -> dict[str, Any]:
    warnings = sorted(set(job.get("warnings", [])) | set(job.get("stderr_warnings", [])))
    triton = job.get("triton", {})
    if not job.get("finished"):
        seen = "crashed"
    elif any("refused" in w for w in warnings):
        seen = "refused"
    elif triton.get("stored_config_failed") or any("failed compiling" in w or
                                                   "failed launching" in w for w in warnings):
        seen = "fallback"
    else:
        seen = "used"
    return {
        "case": case, "expect": expect, "seen": seen,
        "finished": bool(job.get("finished")), "returncode": job.get("returncode"),
        "matches_eager": job.get("matches_eager"), "max_abs_error": job.get("max_abs_error"),
        "warnings": warnings, "n_warnings": len(warnings), "triton": triton,
        "inductor_counters": job.get("inductor_counters"),
        "wall_seconds": job.get("wall_seconds"),
        **({"stderr_tail": job["stderr_tail"]} if "stderr_tail" in job else {}),
    }


def print_table(results: list[dict[str, Any]]) -> None:
    head = f"{'case':<22} {'expect':<9} {'seen':<9} {'finished':<9} {'matches':<8} " \
           f"{'max abs err':<12} {'warnings':<8}"
    print(head)
    print("-" * len(head))
    for r in results:
        err = "-" if r["max_abs_error"] is None else f"{r['max_abs_error']:.3g}"
        print(f"{r['case']:<22} {r['expect']:<9} {r['seen']:<9} "
              f"{'yes' if r['finished'] else 'NO':<9} {r['matches_eager']!s:<8} "
              f"{err:<12} {r['n_warnings']:<8}")
    for r in results:
        for w in r["warnings"]:
            print(f"  [{r['case']}] {w[:200]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    if "://" not in args.db and Path(args.db).exists():
        sys.exit(f"error: {args.db} exists; give a path for a fresh database")
    work = Path(tempfile.mkdtemp(prefix="hostile-triton-"))
    cache = open_cache(args.db)
    try:
        if triton_rows(cache):
            sys.exit(f"error: {args.db} already holds Triton configs; use a fresh database")
        print(f"seed job (tunes and stores every Triton kernel's config) in {work} ...",
              flush=True)
        seed = run_job(args, "seed", work)
        if not seed.get("finished"):
            print(seed.get("stderr_tail", ""), file=sys.stderr)
            sys.exit("error: the seed job did not finish (above)")
        original = triton_rows(cache)
        print(f"seed: {len(original)} Triton configs stored, max abs error "
              f"{seed.get('max_abs_error')}", flush=True)
        if not original:
            if args.device == "cpu":  # Inductor's CPU kernels are C++: nothing to rewrite
                print("cpu smoke test: the seed job ran; no Triton configs to rewrite")
                return 0
            sys.exit("error: no Triton configs were stored (no GPU or no Triton? "
                     "TUNECACHE_SHARE=-triton?)")
        results = []
        for case in args.case_names:
            mutate, expect = CASES[case]
            write_rows(cache, hostile_rows(original, mutate))
            try:
                print(f"case {case} ...", flush=True)
                job = run_job(args, case, work)
            finally:
                if not (args.keep and case == args.case_names[-1]):
                    write_rows(cache, original)
            result = summarize(case, expect, job)
            results.append(result)
            line = json.dumps({"tool": "hostile_triton", "db": args.db, **result})
            print(line, flush=True)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(line + "\n")
    finally:
        cache.close()
    print()
    print_table(results)
    ok = all(r["finished"] and r["matches_eager"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
