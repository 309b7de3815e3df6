"""Which torch tunecache turns on for: no upper bound, each part probes what it hooks
(tunecache.inductor.compat, tunecache.parts.Part.probe), a torch newer than every tested
one is named once, and what changed in torch 2.15 that the hooks read.

"Newer than tested" is simulated with this torch's own internals under a version string
above every tested one (``torch.__version__``, which compat reads).
"""

from __future__ import annotations

import json
import logging
import math

import pytest

torch = pytest.importorskip("torch")

from cli_helpers import run  # noqa: E402
from test_inductor import _run  # noqa: E402

import tunecache  # noqa: E402
from tunecache.inductor import compat  # noqa: E402
from tunecache.inductor.gemm import make_key  # noqa: E402
from tunecache.process import PROCESS  # noqa: E402
from tunecache.switch import parts_on  # noqa: E402

NEWER = "2.99.0+tunecache.test"
INPUTS = "[('cpu', 'torch.float32', [4, 32, 48], [1536, 48, 1], 0)]"


def _newer_lines(records: list[logging.LogRecord]) -> int:
    return sum("newer than the versions tunecache was tested on" in r.getMessage()
               for r in records)


def test_compat_reads_the_version_without_an_upper_bound(monkeypatch):
    monkeypatch.setattr(torch, "__version__", NEWER)
    assert compat.too_old() is None
    assert f"({compat.TESTED_TORCH[0][0]}.{compat.TESTED_TORCH[0][1]}-" in compat.untested()
    monkeypatch.setattr(torch, "__version__", "2.10.1")
    assert "older than 2.11" in compat.too_old()
    assert compat.untested() is None
    monkeypatch.setattr(torch, "__version__", "2.15.0+cu132")
    assert compat.too_old() is None and compat.untested() is None


def test_torch_215_benchmark_policy_eager_is_the_older_versions_key():
    # 2.15 passes lookup() "<inputs key>:benchmark_policy=eager" where 2.13 passed the
    # inputs key: one key, so an upgrade finds the older entry.
    older = make_key("bmm", INPUTS, None, "cpu")
    assert make_key("bmm", INPUTS + ":benchmark_policy=eager", None, "cpu") == older
    graphs = make_key("bmm", INPUTS + ":benchmark_policy=cudagraph_auto:cudagraph_unroll=1",
                      None, "cuda")
    assert graphs["inputs"] == INPUTS
    assert graphs["benchmark_policy"] == "cudagraph_auto:cudagraph_unroll=1"


def test_newer_torch_than_tested_turns_on_every_part_whose_probe_passes(
        monkeypatch, sqlite_url, caplog):
    monkeypatch.setattr(PROCESS, "explained", set())
    expected = None
    try:
        assert tunecache.enable(db=sqlite_url) is True
        expected = parts_on()
    finally:
        tunecache.disable()
    monkeypatch.setattr(torch, "__version__", NEWER)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        try:
            assert tunecache.enable(db=sqlite_url) is True
            assert tunecache.enable(db=sqlite_url) is True
            assert parts_on() == expected and "gemm" in expected
        finally:
            tunecache.disable()
    assert _newer_lines(caplog.records) == 1
    # and nothing else of tunecache's: no part was off
    ours = [r.getMessage() for r in caplog.records
            if r.name == "tunecache" and r.levelno >= logging.WARNING]
    assert len(ours) == 1, ours


def test_a_failing_probe_leaves_that_part_off_named_once(monkeypatch, sqlite_url, caplog):
    from torch._inductor.choices import InductorChoices

    def changed(self, kernel_inputs, op_name):  # another torch's signature
        raise AssertionError("never called: narrowing must not wrap it")

    monkeypatch.setattr(torch, "__version__", NEWER)
    monkeypatch.setattr(PROCESS, "explained", set())
    monkeypatch.setattr(InductorChoices, "_finalize_template_configs", changed)
    with caplog.at_level(logging.WARNING, logger="tunecache"):
        try:
            assert tunecache.enable(db=sqlite_url) is True
            assert tunecache.enable(db=sqlite_url) is True
            on = parts_on()
        finally:
            tunecache.disable()
    assert "gemm" in on and "narrowing" not in on
    named = [r.getMessage() for r in caplog.records if "the narrowing part" in r.getMessage()]
    assert len(named) == 1 and "_finalize_template_configs" in named[0], named
    assert _newer_lines(caplog.records) == 1
    assert InductorChoices.__dict__["_finalize_template_configs"] is changed


def test_newer_torch_compiles_with_its_parts_on_and_outputs_equal(tmp_path):
    db = f"sqlite:///{tmp_path / 'tune.db'}"
    plain = _run(tmp_path, "plain", None, "--ops", "bmm")
    real = _run(tmp_path, "real", db, "--ops", "bmm")
    newer = _run(tmp_path, "newer", db, "--ops", "bmm", "--fake-torch-version", NEWER)
    assert real["enabled"] and newer["enabled"]
    assert newer["parts"] == real["parts"] and "gemm" in newer["parts"]
    assert newer["log"].count("newer than the versions tunecache was tested on") == 1
    assert "newer than the versions" not in real["log"]
    for run_ in (real, newer):
        assert all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
                   for a, b in zip(plain["outputs"]["bmm"], run_["outputs"]["bmm"],
                                   strict=True))


def test_doctor_prints_torch_and_triton_versions_and_the_parts_on(sqlite_url):
    result = run("doctor", "--db", sqlite_url, "--json")
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    libraries = checks["libraries"]["message"]
    assert f"torch {torch.__version__}," in libraries
    assert "Triton " in libraries and "parts on: " in libraries
    on = libraries.split("parts on: ", 1)[1].split(", ")
    assert "gemm" in on and "narrowing" in on
    # graphs, kernels and profiles need a key: off, and the doctor says why
    assert "no key" in checks["part graphs"]["message"]
