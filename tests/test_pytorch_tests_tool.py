"""tools/pytorch_tests.py: which of a source tree's tests change outcome with tunecache.

Run on a tiny fake tree of two test files whose tests read the environment the tool sets
up, so that each outcome is known (no torch is imported: fast)."""

from __future__ import annotations

import json
import subprocess
import sys

from tool_modules import load_tool

tool = load_tool("pytorch_tests")

_INDUCTOR = '''
import os, pytest

def test_same_everywhere():
    pass

def test_fails_with_a_database():
    assert "TUNECACHE_DB" not in os.environ

@pytest.mark.skip(reason="skipped in every mode")
def test_skipped():
    pass
'''

_DYNAMO = '''
import os, unittest

class TestKeys(unittest.TestCase):
    def test_fails_with_a_key(self):
        self.assertNotIn("TUNECACHE_SIGNING_KEY", os.environ)

    def test_fresh_inductor_cache_per_mode(self):
        self.assertFalse(os.listdir(os.environ["TORCHINDUCTOR_CACHE_DIR"]))
'''


def test_it_lists_every_test_whose_outcome_differs_between_the_three_ways(tmp_path):
    src = tmp_path / "src"
    (src / "test" / "inductor").mkdir(parents=True)
    (src / "test" / "dynamo").mkdir()
    (src / "test" / "inductor" / "test_a.py").write_text(_INDUCTOR)
    (src / "test" / "dynamo" / "test_b.py").write_text(_DYNAMO)
    done = subprocess.run(
        [sys.executable, str(tool.__file__), "--torch-src", str(src), "--files",
         "test/inductor/test_a.py", "test/dynamo/test_b.py", "--work", str(tmp_path / "w"),
         "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["counts"] == {"plain": {"passed": 4, "skipped": 1},
                                "db": {"failed": 1, "passed": 3, "skipped": 1},
                                "key": {"failed": 2, "passed": 2, "skipped": 1}}
    assert result["differences"] == [
        {"test": "test/dynamo/test_b.py::TestKeys::test_fails_with_a_key",
         "outcomes": {"plain": "passed", "db": "passed", "key": "failed"}},
        {"test": "test/inductor/test_a.py::test_a::test_fails_with_a_database",
         "outcomes": {"plain": "passed", "db": "failed", "key": "failed"}},
    ]
    assert (tmp_path / "w" / "keys" / "tunecache-signing.key").exists()


def test_a_file_that_crashes_or_is_missing_from_a_mode_counts_as_differing():
    runs = {"plain": {"f::t1": "passed", "f::t2": "passed"},
            "db": {"f::*": "crashed (exit 2)"},
            "key": {"f::t1": "passed", "f::t2": "passed"}}
    diff = tool.differences(runs)
    assert [d["test"] for d in diff] == ["f::*", "f::t1", "f::t2"]
    assert diff[1]["outcomes"] == {"plain": "passed", "db": "absent", "key": "passed"}


def test_junit_outcomes_keep_the_worse_of_a_test_reported_twice():
    junit = """<testsuites><testsuite>
      <testcase classname="test.inductor.test_x.TestX" name="test_one"/>
      <testcase classname="test.inductor.test_x.TestX" name="test_one"><error/></testcase>
      <testcase classname="test.inductor.test_x.TestX" name="test_two"><failure/></testcase>
      <testcase classname="test.inductor.test_x.TestX" name="test_three"><skipped/></testcase>
    </testsuite></testsuites>"""
    assert tool.outcomes_of(junit, "x.py") == {"x.py::TestX::test_one": "error",
                                               "x.py::TestX::test_two": "failed",
                                               "x.py::TestX::test_three": "skipped"}
