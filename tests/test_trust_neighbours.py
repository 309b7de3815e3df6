"""Neighbour rows are other keys' rows: one that cannot be read (a 310-digit number, text of
32 MiB, a planted hits count) costs only itself. A new key is still tuned, is never charged
an attempt for it, and the process warns once. Also the local files and recorded sizes a
planted database or cache directory can point tunecache at (kernel group files, warm's
inputs)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import text

import tunecache
from tunecache.keys import Key

HUGE = "1" + "0" * 309  # a 310-digit JSON integer


def _plant(url: str, rows: list[dict[str, object]]) -> None:
    """Done rows written as a hostile writer would: straight into the table."""
    with tunecache.open(url) as cache:
        db = cache.database()
        assert db is not None  # the schema is there
        db.run(lambda c: c.execute(text(
            "INSERT INTO tunecache_entries (key_hash, key_json, kind, op, family, state, "
            "token, attempts, timings_json, meta_json, created_at, updated_at, hits) VALUES "
            "(:key_hash, :key_json, :kind, 'mm', :family, 'done', 1, 1, :timings_json, "
            ":meta_json, :at, :at, :hits)"),
            [{"kind": "test", "meta_json": None, "at": 1.0e9, "hits": 0, **r}
             for r in rows]), write=True)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "tunecache" and r.levelno >= logging.WARNING]


def _neighbour(i: int, **fields: object) -> dict[str, object]:
    key = {"kind": "test", "op": "mm", "m": i}
    return {"key_hash": Key.of(key).hash, "key_json": json.dumps(key),
            "timings_json": json.dumps({"a": 1.0, "b": 2.0}), "family": "fam", **fields}


@pytest.mark.parametrize("column,value", [
    ("timings_json", '{"a": ' + HUGE + ', "b": 1.0}'),
    ("meta_json", '{"transfer": {"benchmarked": ' + HUGE + '}}'),
    ("key_json", '{"kind": "test", "op": "mm", "m": ' + HUGE + '}'),
    ("meta_json", '{"best_ms": NaN}'),
])
def test_a_310_digit_number_in_a_neighbour_costs_only_that_row(db_url, caplog, column, value):
    _plant(db_url, [_neighbour(1), _neighbour(2, **{column: value}), _neighbour(3)])
    with tunecache.open(db_url) as cache:
        new = Key.of({"kind": "test", "op": "mm", "m": 4}, family="fam")
        for _ in range(2):  # the warning is once per process, not once per read
            found = {n.key_hash: n for n in cache.neighbours(new)}
        bad = _neighbour(2)["key_hash"]
        assert _neighbour(1)["key_hash"] in found and _neighbour(3)["key_hash"] in found
        if column == "meta_json":
            assert found[bad].meta == {}  # read as no meta, the rest of the row kept
            assert _warnings(caplog) == []
        else:
            assert bad not in found
            assert len(_warnings(caplog)) == 1 and "neighbour" in _warnings(caplog)[0]
        result = cache.get_or_tune(new, lambda: {"a": 1.0})
        assert result.source == "tuned"


def test_neighbours_of_32_mib_are_skipped_without_reading_them(db_url, tmp_path):
    big = "x" * (32 << 20)
    rows = [_neighbour(i, **{column: json.dumps({"pad": big})})
            for i, column in enumerate(["key_json", "timings_json", "meta_json"] * 2)]
    _plant(db_url, [*rows, _neighbour(10)])
    del big, rows
    # Peak memory in a fresh process, so that this test's own planting is not counted.
    script = textwrap.dedent(f"""
        import tracemalloc, tunecache
        from tunecache.keys import Key
        with tunecache.open({db_url!r}) as cache:
            cache.neighbours(Key.of({{"kind": "test", "m": 0}}, family="another"))
            tracemalloc.start()
            found = cache.neighbours(Key.of({{"kind": "test", "m": 4}}, family="fam"))
            peak = tracemalloc.get_traced_memory()[1]
        print(len(found), peak)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
                         check=True).stdout.split()
    # The 32 MiB meta rows keep their key and timings; the others are skipped.
    assert int(out[0]) == 3
    # Six rows of 32 MiB read whole cost 192 MiB; bounded in SQL, none of it leaves.
    assert int(out[1]) < 16 << 20


@pytest.mark.parametrize("planted_with", [{"hits": 2**31 - 1}, {"at": 4.0e9}],
                         ids=["a huge hits count", "a publish time ahead of the clock"])
def test_planted_rows_do_not_push_genuine_neighbours_out(db_url, planted_with):
    planted = [_neighbour(100 + i, timings_json="not json", **planted_with) for i in range(64)]
    _plant(db_url, planted)
    with tunecache.open(db_url) as cache:
        cache.get_or_tune(Key.of({"kind": "test", "op": "mm", "m": 1}, family="fam"),
                          lambda: {"a": 1.0})
        found = cache.neighbours(Key.of({"kind": "test", "op": "mm", "m": 4}, family="fam"))
    assert [n.key["m"] for n in found] == [1]


def test_a_keys_own_row_of_32_mib_reads_as_no_entry(db_url):
    key = {"kind": "test", "op": "mm", "m": 1}
    _plant(db_url, [_neighbour(1, timings_json=json.dumps({"a": 1.0, "pad": "x" * (2 << 20)}))])
    with tunecache.open(db_url) as cache:
        row = cache.store.read([Key.of(key).hash])[Key.of(key).hash]
        assert row.timings_json is None and row.state == "done"
        assert cache.lookup(key) is None


# -- local files and names


def test_a_fifo_planted_as_a_local_group_file_does_not_hang_get_group(tmp_path, monkeypatch):
    from fifo_helpers import returns_within

    from tunecache.triton_cache import KernelCacheManager

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    manager = KernelCacheManager("k" * 32)
    manager.shared = False  # the local directory only
    fifo = Path(manager.cache_dir) / "__grp__kernel.json"
    os.mkfifo(fifo)
    assert returns_within(lambda: manager.get_group("kernel.json"), fifo) is None
    zero = Path(manager.cache_dir) / "__grp__zero.json"
    zero.symlink_to("/dev/zero")
    assert manager.get_group("zero.json") is None


def test_a_kernel_file_name_with_a_trailing_newline_is_not_a_plain_name():
    from tunecache.triton_cache import pack, unpack

    assert unpack(pack("k.json", {"k.json": b"{}", "k.cubin": b"x"})) is not None
    assert unpack(pack("k.json", {"k.json": b"{}", "k.cubin\n": b"x"})) is None


def test_warm_skips_a_recorded_key_whose_inputs_would_not_fit_in_memory(sqlite_url):
    from tunecache.warm import select_tasks

    inputs = repr([("cpu", "torch.float32", 10**9, 10**6, 10**6, 1, 0),
                   ("cpu", "torch.float32", 10**6, 8, 8, 1, 0)])
    key = {"kind": "gemm", "op": "mm", "inputs": inputs, "env": {}}
    with tunecache.open(sqlite_url) as cache:
        cache.get_or_tune(key, lambda: {"aten": 1.0})
        db = cache.database()
        assert db is not None
        tasks, skipped = select_tasks(db)
    assert tasks == []
    assert [s["reason"] for s in skipped] == [
        "its inputs take 7450580 GiB, more than the 8 GiB warm allocates for one key"]
