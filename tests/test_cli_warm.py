"""tunecache warm: re-tune recorded GEMM keys on this machine (real Inductor autotune on CPU).

torch 2.13's CPU build really autotunes bmm (ATen vs the C++ bmm template, about 3-6 s a
key), so these tests run the whole path: keys recorded under an older torch, `tunecache
warm` in a fresh process, then a fresh compiling process that must benchmark nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import populate, run, run_json

pytest.importorskip("torch")

import tunecache
from tunecache import inductor as tc_inductor

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
TUNECACHE = Path(sys.executable).with_name("tunecache")

# Inductor's inputs_key for bmm of (4,32,48) x (4,48,40) fp32 contiguous: what
# tests/inductor_worker.py --ops bmm compiles.
WORKER_BMM = ("[('cpu', 'torch.float32', 4, 32, 48, 1536, 48, 1, 0), "
              "('cpu', 'torch.float32', 4, 48, 40, 1920, 40, 1, 0)]")
SMALL_BMM = ("[('cpu', 'torch.float32', 2, 16, 24, 384, 24, 1, 0), "
             "('cpu', 'torch.float32', 2, 24, 8, 192, 8, 1, 0)]")


def old_key(inputs: str, op: str = "bmm", torch: str = "2.12.0+cpu") -> dict:
    """A key as an earlier job under another torch build recorded it."""
    return {"kind": "gemm", "op": op, "inputs": inputs, "precision": "highest",
            "hint_override": None,
            "env": {"device": "Old CPU", "device_type": "cpu", "torch": torch,
                    "triton": "none", "threads": str(_threads())}}


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _env(tmp: Path, db: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    cache_dir = tmp / f"inductor-{time.monotonic_ns()}"
    cache_dir.mkdir(parents=True)
    env.update(TUNECACHE_DB=db, TORCHINDUCTOR_CACHE_DIR=str(cache_dir),
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0", **extra)
    return env


def _warm(tmp: Path, db: str, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([str(TUNECACHE), "warm", "--json", *args], env=_env(tmp, db, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(tmp))


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def test_warm_dry_run_selects_and_dedups(sqlite_url):
    populate(sqlite_url, [old_key(WORKER_BMM), old_key(WORKER_BMM, torch="2.11.0"),
                          old_key(SMALL_BMM), old_key("[]", op="mm"),
                          {"kind": "other", "op": "bmm", "inputs": WORKER_BMM}])
    data = run_json("warm", "--db", sqlite_url, "--dry-run", "--op", "bmm")
    assert data["keys"] == 2
    assert [len(t["seen_in"]) for t in data["tasks"]] == [1, 2]
    only = run_json("warm", "--db", sqlite_url, "--dry-run", "--from-torch", "2.11.0")
    assert [t["inputs"] for t in only["tasks"]] == [WORKER_BMM]
    bad = run("warm", "--db", sqlite_url, "--op", "conv")
    assert bad.exit_code == 2


def test_warm_then_a_fresh_job_benchmarks_nothing(sqlite_url, tmp_path):
    populate(sqlite_url, [old_key(WORKER_BMM)])
    report = _finish(_warm(tmp_path, sqlite_url))
    assert (report["keys"], report["tuned"], report["error"]) == (1, 1, 0), report
    assert report["tasks"][0]["benchmarks"] == 1

    out = tmp_path / "job.json"
    job = subprocess.run(
        [sys.executable, str(TESTS / "inductor_worker.py"), "--ops", "bmm", "--out", str(out)],
        env=_env(tmp_path, sqlite_url, PYTHONPATH=str(REPO)), capture_output=True, text=True,
        timeout=300, check=False)
    assert job.returncode == 0, job.stderr[-3000:]
    stats = json.loads(out.read_text())["stats"]
    assert stats["benchmarks"] == 0 and stats["hits"] == 1, stats

    again = _finish(_warm(tmp_path, sqlite_url))  # nothing left to do: no compile at all
    assert (again["hit"], again["tuned"]) == (1, 0)


def test_warm_tunes_every_key_in_full_even_next_to_one_it_just_tuned(sqlite_url, tmp_path):
    # Two bmm keys of one family (docs/transfer.md): in a job the second would be tuned
    # from the first; warm is the offline job whose full results transfer starts from.
    populate(sqlite_url, [old_key(WORKER_BMM), old_key(SMALL_BMM)])
    report = _finish(_warm(tmp_path, sqlite_url))
    assert (report["keys"], report["tuned"], report["error"]) == (2, 2, 0), report
    with tunecache.open(sqlite_url) as cache:
        metas = [dict(r.meta) for r in (
            cache.lookup(tc_inductor.make_key("bmm", inputs, None, "cpu"))
            for inputs in (WORKER_BMM, SMALL_BMM)) if r is not None]
    assert len(metas) == 2 and not any("transfer" in m for m in metas), metas


def test_warm_splits_work_across_ranks(pg_url, tmp_path):
    # PostgreSQL, as a cluster runs it; the claims themselves are tested on both backends
    # in the core tests, and each run here costs two compiling processes.
    db_url = pg_url
    populate(db_url, [old_key(WORKER_BMM), old_key(SMALL_BMM)])
    procs = [_warm(tmp_path, db_url, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r))
             for r in range(2)]
    reports = [_finish(p) for p in procs]
    assert [r["tuned"] for r in reports] == [1, 1], reports
    assert all(r["hit"] + r["peer"] == 1 for r in reports)
    tuned = [t["key_hashes"] for r in reports for t in r["tasks"] if t["outcome"] == "tuned"]
    assert len({h for hs in tuned for h in hs}) == 2  # each key tuned once, by one rank


@pytest.mark.parametrize("hostile", ["(" * 1500 + ")" * 1500, "__import__('os').system('true')",
                                     "[('cuda', 'torch.float32', 8, 8, 8, 1)] " * 200])
def test_hostile_inputs_key_is_refused_with_a_value_error(hostile):
    from tunecache.warm import parse_inputs

    with pytest.raises(ValueError):
        parse_inputs(hostile)


# -- ops beyond mm/addmm/bmm/baddbmm ---------------------------------------------------------

# Inductor's inputs key of mm_plus_mm (a, b, c, d) for mm(a, b) + mm(c, d), as a job's
# backward records it: a, c (64, 48); b, d (48, 32), b column-major (a transposed weight).
MPM = ("[('cpu', 'torch.float32', 64, 48, 48, 1, 0), ('cpu', 'torch.float32', 48, 32, 1, 48, 0), "
       "('cpu', 'torch.float32', 64, 48, 48, 1, 0), ('cpu', 'torch.float32', 48, 32, 32, 1, 0)]")
# bf16, and b and c slices of bigger buffers (storage offsets), as in a fused projection.
MPM_VIEWS = ("[('cpu', 'torch.bfloat16', 40, 24, 1, 40, 0), "
             "('cpu', 'torch.bfloat16', 24, 16, 16, 1, 7), "
             "('cpu', 'torch.bfloat16', 40, 24, 24, 1, 3), "
             "('cpu', 'torch.bfloat16', 24, 16, 1, 24, 0)]")
INT_MM = "[('cpu', 'torch.int8', 32, 64, 64, 1, 0), ('cpu', 'torch.int8', 64, 16, 16, 1, 0)]"


def test_warm_cli_op_choices_are_the_ops_warm_can_rebuild():
    from tunecache.cli import warm as warm_cmd
    from tunecache.warm import WARM_OPS

    (op_option,) = [p for p in warm_cmd.params if p.name == "op"]
    assert list(op_option.type.choices) == list(WARM_OPS)
    assert {"mm_plus_mm", "int_mm"} <= set(WARM_OPS)


def test_mm_plus_mm_call_built_from_a_recorded_key_has_its_layouts_and_computes_the_sum(
        monkeypatch):
    import torch

    from tunecache.warm import build_call, parse_inputs

    seen: list = []
    real_mm = torch.mm

    def spy_mm(x, y):
        seen.append(((tuple(x.shape), x.stride(), x.storage_offset(), x.dtype),
                     (tuple(y.shape), y.stride(), y.storage_offset(), y.dtype)))
        return real_mm(x, y)

    monkeypatch.setattr(torch, "mm", spy_mm)
    for inputs in (MPM, MPM_VIEWS):
        specs = parse_inputs(inputs)
        fn, args = build_call("mm_plus_mm", specs, torch.device("cpu"))
        seen.clear()
        out = fn(*args)
        # The two products the function computes take exactly the recorded tensors.
        want = [(s.size, s.stride, s.offset, getattr(torch, s.dtype.split(".")[1]))
                for s in specs]
        assert seen == [(want[0], want[1]), (want[2], want[3])]
        views = [a if s.offset == 0 else a.as_strided(s.size, s.stride, s.offset)
                 for a, s in zip(args, specs)]
        ref = views[0].double() @ views[1].double() + views[2].double() @ views[3].double()
        assert out.shape == (specs[0].size[0], specs[1].size[1]) and out.dtype == want[0][3]
        tol = 1e-4 if want[0][3] == torch.float32 else 0.1
        assert torch.allclose(out.double(), ref, atol=tol, rtol=tol)


def _selector_calls(monkeypatch, tmp_path, op: str, inputs: str) -> list:
    """(name, inputs key) of every call of Inductor's algorithm selector while compiling
    the call warm builds for ``op`` from ``inputs``; single-candidate calls included."""
    import torch
    import torch._dynamo
    from torch._inductor import config
    from torch._inductor import select_algorithm as sa

    from tunecache.warm import build_call, parse_inputs

    calls: list = []
    real = sa.AlgorithmSelectorCache.__call__

    def spy(self, name, choices, input_nodes, *args, **kwargs):
        calls.append((name, sa.create_inputs_key(input_nodes)))
        return real(self, name, choices, input_nodes, *args, **kwargs)

    monkeypatch.setattr(sa.AlgorithmSelectorCache, "__call__", spy)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    fn, args = build_call(op, parse_inputs(inputs), torch.device("cpu"))
    torch._dynamo.reset()
    try:
        with config.patch({"fx_graph_cache": False, "autotune_local_cache": False}), \
                torch.no_grad():
            torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)(*args)
    finally:
        torch._dynamo.reset()
    return calls


@pytest.mark.parametrize("op,inputs", [("mm_plus_mm", MPM), ("mm_plus_mm", MPM_VIEWS),
                                       ("int_mm", INT_MM)],
                         ids=["mm_plus_mm", "mm_plus_mm-bf16-offsets", "int_mm"])
def test_warm_compile_makes_inductor_select_exactly_the_recorded_op_and_inputs_key(
        monkeypatch, tmp_path, op, inputs):
    # Real Inductor lowering on CPU (for mm_plus_mm: the post-grad pattern rewriting
    # mm + mm into tuned_mm_plus_mm): the selector sees the recorded op name and inputs
    # key, which is what it would look up in the cache wherever it has candidates to tune.
    assert _selector_calls(monkeypatch, tmp_path, op, inputs) == [(op, inputs)]


def test_warm_recompiles_recorded_mm_plus_mm_and_int_mm_cpu_keys_and_reports_them_not_autotuned(
        sqlite_url, tmp_path):
    # On CPU Inductor has one candidate for both (ATen; mm_plus_mm's Triton template needs
    # a GPU), so it benchmarks and looks up nothing: warm must say so, per key, with the
    # reason, and never count them as warmed, while the bmm key in the same run is tuned.
    populate(sqlite_url, [old_key(MPM, op="mm_plus_mm"), old_key(INT_MM, op="int_mm"),
                          old_key(SMALL_BMM)])
    report = _finish(_warm(tmp_path, sqlite_url))
    assert (report["keys"], report["tuned"], report["not_autotuned"], report["error"],
            report["hit"], report["local"]) == (3, 1, 2, 0, 0, 0), report
    by_op = {t["op"]: t for t in report["tasks"]}
    assert by_op["bmm"]["outcome"] == "tuned" and by_op["bmm"]["key_hashes"]
    for op in ("mm_plus_mm", "int_mm"):
        task = by_op[op]
        assert task["outcome"] == "not_autotuned", task
        assert "single candidate" in task["reason"], task
        assert (task["benchmarks"], task["key_hashes"]) == (0, []), task
    # Nothing was stored for this machine: the only mm_plus_mm/int_mm entries are the
    # recorded ones.
    for op in ("mm_plus_mm", "int_mm"):
        rows = run_json("ls", "--db", sqlite_url, "--op", op)
        assert [r["torch"] for r in rows] == ["2.12.0+cpu"], rows


def test_warm_lists_recorded_keys_it_cannot_rebuild_as_skipped_with_the_reason(sqlite_url):
    bad_mpm = MPM.replace("64, 48, 48, 1, 0), ('cpu', 'torch.float32', 48, 32, 32",
                          "64, 40, 40, 1, 0), ('cpu', 'torch.float32', 40, 32, 32")
    fp_int_mm = INT_MM.replace("int8", "float32")
    keys = {"scaled_mm": old_key(MPM, op="scaled_mm"),
            "packed_linear": old_key(WORKER_BMM, op="packed_linear"),
            "convolution": old_key(WORKER_BMM, op="convolution"),
            "bad_mpm": old_key(bad_mpm, op="mm_plus_mm"),
            "three_input_mpm": old_key(INT_MM[:-1] + ", ('cpu', 'torch.int8', 1, 1, 0)]",
                                       op="mm_plus_mm"),
            "fp_int_mm": old_key(fp_int_mm, op="int_mm"),
            "mm_plus_mm": old_key(MPM, op="mm_plus_mm"),
            "int_mm": old_key(INT_MM, op="int_mm"),
            "bmm": old_key(SMALL_BMM)}
    populate(sqlite_url, keys.values())
    from tunecache.keys import key_hash

    name_of = {key_hash(k)[0]: name for name, k in keys.items()}

    data = run_json("warm", "--db", sqlite_url, "--dry-run")
    assert sorted(t["op"] for t in data["tasks"]) == ["bmm", "int_mm", "mm_plus_mm"]
    reasons = {name_of[s["key_hash"]]: (s["op"], s["reason"]) for s in data["skipped"]}
    assert set(reasons) == {"scaled_mm", "packed_linear", "convolution", "bad_mpm",
                            "three_input_mpm", "fp_int_mm"}
    assert reasons["scaled_mm"][0] == "scaled_mm"
    assert "out_dtype" in reasons["scaled_mm"][1]
    assert "frozen nn.Linear" in reasons["packed_linear"][1]
    assert "cannot rebuild a 'convolution' call" in reasons["convolution"][1]
    assert "not two products of equal sizes" in reasons["bad_mpm"][1]
    assert "takes 4 inputs, the inputs key has 3" in reasons["three_input_mpm"][1]
    assert "int8" in reasons["fp_int_mm"][1]

    # --op narrows both lists to that op.
    only = run_json("warm", "--db", sqlite_url, "--dry-run", "--op", "mm_plus_mm")
    assert [t["inputs"] for t in only["tasks"]] == [MPM]
    assert sorted(name_of[s["key_hash"]] for s in only["skipped"]) == ["bad_mpm",
                                                                       "three_input_mpm"]
    # People see every skipped key and its reason too.
    human = run("warm", "--db", sqlite_url, "--dry-run")
    assert human.exit_code == 0
    for h in name_of:
        if name_of[h] in reasons:
            assert f"skipped {h[:16]}: " in human.stderr
    assert run("warm", "--db", sqlite_url, "--op", "scaled_mm").exit_code == 2


def test_warm_human_report_prints_each_unwarmed_key_with_its_reason(sqlite_url, monkeypatch):
    import tunecache.warm as warm_mod

    populate(sqlite_url, [old_key(MPM, op="mm_plus_mm"), old_key(MPM, op="scaled_mm")])

    def fake_warm(settings, db, tasks, progress=None):  # the compile is tested above
        (task,) = tasks
        return warm_mod.WarmReport(
            database="x", rank=0, world_size=1, keys=1, tuned=0, hit=0, peer=0, local=0,
            not_autotuned=1, error=0, seconds=1.0,
            tasks=({**task.as_dict(), "outcome": "not_autotuned",
                    "reason": "Inductor autotuned nothing: single candidate"},))

    monkeypatch.setattr(warm_mod, "warm", fake_warm)
    result = run("warm", "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    assert "1 not autotuned" in result.stdout and "1 recorded keys skipped" in result.stdout
    assert f"not_autotuned: mm_plus_mm {MPM}: Inductor autotuned nothing" in result.stderr
    assert "skipped " in result.stderr and "op 'scaled_mm' is not warmed" in result.stderr


@pytest.mark.parametrize("events,fallbacks,want", [
    ([{"source": "tuned", "op": "mm_plus_mm", "key_hash": "aa" * 32}], 0, ("tuned", False)),
    ([{"source": "memo", "op": "mm_plus_mm", "key_hash": "aa" * 32}], 0, ("hit", False)),
    ([{"source": "hit", "op": "mm", "key_hash": "bb" * 32},
      {"source": "peer", "op": "mm_plus_mm", "key_hash": "aa" * 32}], 0, ("peer", False)),
    # Tuned, but not the recorded key (say mm + mm lowered to two mm): not warmed.
    ([{"source": "tuned", "op": "mm", "key_hash": "bb" * 32},
      {"source": "tuned", "op": "mm", "key_hash": "cc" * 32}], 0, ("not_autotuned", True)),
    ([], 0, ("not_autotuned", True)),
    ([{"source": "fallback", "op": "mm_plus_mm", "key_hash": None}], 1, ("local", True)),
], ids=["tuned", "memo", "peer-among-others", "other-keys", "nothing", "fallback"])
def test_warm_counts_a_compile_as_warmed_only_if_it_looked_up_this_machines_key(
        events, fallbacks, want):
    from tunecache.warm import classify

    outcome, reason = classify(events, fallbacks, "aa" * 32)
    assert (outcome, reason is not None) == want
    if want[0] == "not_autotuned" and events:
        assert "mm bbbbbbbbbbbb" in reason and "mm cccccccccccc" in reason


# A training step whose backward has the mm(a, b) + mm(c, d) Inductor rewrites to
# mm_plus_mm: x feeds two linears, so grad_x = g1 @ w1 + g2 @ w2 (a gated MLP's input).
GPU_JOB = r"""
import json, sys
import torch
import tunecache
from tunecache import inductor as tc_inductor
assert tunecache.enable()
torch.manual_seed(0)
x = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w1 = torch.randn(384, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w2 = torch.randn(384, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
def step(x, w1, w2):
    return (torch.nn.functional.linear(x, w1) * torch.nn.functional.linear(x, w2)).float().sum()
torch.compile(step, mode="max-autotune-no-cudagraphs", dynamic=False)(x, w1, w2).backward()
with torch.no_grad():  # and an int8 GEMM (a quantized layer): aten._int_mm
    q = torch.randint(-8, 8, (64, 128), device="cuda", dtype=torch.int8)
    k = torch.randint(-8, 8, (128, 96), device="cuda", dtype=torch.int8)
    torch.compile(lambda q, k: torch._int_mm(q * 2, k).relu(),
                  mode="max-autotune-no-cudagraphs", dynamic=False)(q, k)
json.dump(tunecache.stats().gemm.as_dict(), open(sys.argv[1], "w"))
"""


def _gpu_job(tmp: Path, db: str, name: str) -> dict:
    out = tmp / f"{name}.json"
    job = subprocess.run([sys.executable, "-c", GPU_JOB, str(out)],
                         env=_env(tmp, db, PYTHONPATH=str(REPO)), capture_output=True,
                         text=True, timeout=600, check=False)
    assert job.returncode == 0, job.stderr[-3000:]
    return json.loads(out.read_text())


def test_warm_recompiles_recorded_cuda_mm_plus_mm_key_so_a_later_job_does_not_tune_it(
        tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("mm_plus_mm is autotuned only on a GPU (CPU: tested above)")
    # A job records its keys, as a job under an older torch would have.
    job_db = f"sqlite:///{tmp_path / 'job.db'}"
    first = _gpu_job(tmp_path, job_db, "first")
    recorded = {op: {e["key_hash"] for e in first["events"]
                     if e["op"] == op and e["source"] == "tuned"}
                for op in ("mm_plus_mm", "int_mm")}
    assert [len(recorded[op]) for op in recorded] == [1, 1], first["events"]
    export = tmp_path / "job.jsonl"
    assert run("export", "--db", job_db, "-o", str(export)).exit_code == 0
    lines = [json.loads(line) for line in export.read_text().splitlines()[1:]]
    keys = [{**e["key"], "env": {**e["key"]["env"], "torch": "2.10.0+old"}} for e in lines]
    db = f"sqlite:///{tmp_path / 'old.db'}"
    populate(db, keys)

    report = _finish(_warm(tmp_path, db))
    assert report["error"] == 0 and report["tuned"] == report["keys"], report
    for op, hashes in recorded.items():
        (task,) = [t for t in report["tasks"] if t["op"] == op]
        # The one-op compile looked up exactly the key the job had (for mm_plus_mm: the
        # backward's grad_x, from buffers of that graph).
        assert task["outcome"] == "tuned" and set(task["key_hashes"]) == hashes, task

    later = _gpu_job(tmp_path, db, "later")  # fresh Inductor cache, warmed database
    events = later["events"]
    for op, hashes in recorded.items():
        assert {e["key_hash"] for e in events if e["op"] == op} == hashes, events
    assert all(e["source"] in ("hit", "memo") for e in events), events
    assert later["tuned"] == 0 and later["local"] == 0, later
    # What the later job still measures is only candidates a job's mm had beyond those of
    # warm's one-op compile (topped up, not warmed); none for mm_plus_mm or int_mm.
    assert all(e.get("missing", 0) == 0 for e in events if e["op"] in recorded), events
    assert later["candidates_benchmarked"] == sum(e.get("missing", 0) for e in events), later


def test_a_from_torch_that_matches_no_stored_version_warns_as_prune_does(db_url):
    populate(db_url, [old_key(WORKER_BMM)])
    result = run("warm", "--db", db_url, "--dry-run", "--from-torch", "9.9")
    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        "Warning: --from-torch 9.9 matches no stored torch version (stored: 2.12.0+cpu); it "
        "selects nothing"]
    assert result.stdout.splitlines()[0] == "would warm 0 GEMMs (dry run)"


def test_a_warm_up_leaves_the_environment_variables_as_it_found_them(sqlite_url, monkeypatch):
    # A warm-up in a longer-lived process (a notebook, a job's own script) must not turn
    # Inductor's local caches off for everything that compiles after it.
    from tunecache.settings import Settings
    from tunecache.store import Database
    from tunecache.warm.run import warm

    monkeypatch.delenv("TORCHINDUCTOR_FX_GRAPH_CACHE", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    before = dict(os.environ)
    db = Database(sqlite_url)
    try:
        report = warm(Settings(db_url=sqlite_url), db, [])
    finally:
        db.dispose()
    assert report.keys == 0
    assert dict(os.environ) == before


def test_warm_without_torch_installed_is_one_line_naming_what_to_install(sqlite_url,
                                                                       monkeypatch):
    populate(sqlite_url, [{"kind": "gemm", "op": "mm"}])
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as if absent
    result = run("warm", "--db", sqlite_url)
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: warm compiles with torch, which is not installed here: pip install "
        "'tunecache[torch]' (or the build your jobs use); --dry-run lists the keys without it")
