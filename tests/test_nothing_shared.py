"""A job with TUNECACHE_DB set whose compile autotunes nothing says so, once, at exit.

On a CPU a plain nn.Linear is not autotuned (only bmm and frozen Linear are), so the
opening example of the README stores nothing; without this line the user sees nothing
at all (no database either) and cannot tell why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = "found nothing to share"

_JOB = """
import sys
import torch

from contextlib import nullcontext
from unittest.mock import patch

from torch._inductor import config, select_algorithm


def theirs(self, choices, name, key, benchmark, hint_override=None):
    return {} if benchmark is None else benchmark(choices)


with torch.no_grad():
    if sys.argv[1] == "linear":
        model = torch.nn.Linear(64, 32)
        torch.compile(model, mode="max-autotune")(torch.randn(16, 64))
    else:
        fn = torch.compile(lambda a, b: torch.bmm(a, b), mode="max-autotune")
        with config.patch(max_autotune_gemm_backends="CPP,ATEN"), (
                patch.object(select_algorithm.AlgorithmSelectorCache, "lookup", theirs)
                if sys.argv[1] == "patched" else nullcontext()):
            fn(torch.randn(4, 32, 48), torch.randn(4, 48, 40))
"""


def _job(tmp: Path, op: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TUNECACHE_", "TORCHINDUCTOR_"))}
    (tmp / "inductor").mkdir()
    env.update(TUNECACHE_DB=str(tmp / "tune.db"), TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", _JOB, op], env=env, cwd=str(tmp),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def test_plain_linear_on_cpu_says_once_that_the_job_found_nothing_to_share(tmp_path):
    done = _job(tmp_path, "linear")
    lines = [line for line in done.stderr.splitlines() if MARKER in line]
    assert len(lines) == 1, done.stderr[-4000:]
    assert "bmm" in lines[0] and "freezing" in lines[0]
    assert str(tmp_path / "tune.db") in lines[0]


def test_job_that_autotunes_does_not_say_it_found_nothing(tmp_path):
    done = _job(tmp_path, "bmm")
    assert MARKER not in done.stderr, done.stderr[-4000:]
    assert (tmp_path / "tune.db").exists()


def test_a_job_whose_gemms_went_through_someones_patched_lookup_says_that(tmp_path):
    done = _job(tmp_path, "patched")
    lines = [line for line in done.stderr.splitlines() if MARKER in line]
    assert len(lines) == 1, done.stderr[-4000:]
    assert "patched over tunecache's" in lines[0] and "bmm" not in lines[0], lines[0]
