"""tools/triton_config_diff.py: which Triton kernels two jobs tuned to the same config,
from `tunecache ls --json` listings (a real listing: tests/test_triton_transfer.py)."""

from __future__ import annotations

import json
import os

from tool_modules import load_tool


def _entry(key: str, xblock: int, warps: int = 4, seconds: object = 0.5
           ) -> dict[str, object]:
    best = {"XBLOCK": xblock, "num_warps": warps, "num_stages": 1, "found_by_coordesc": True,
            "configs_hash": key * 8, "triton_cache_hash": None}
    return {"key_hash": key, "op": f"triton_poi_{key}", "kind": "triton_config",
            "best": json.dumps(best), "tune_seconds": seconds}


def test_kernels_are_compared_by_their_config_and_the_recorded_ones_left_out():
    a = [_entry("k1", 256), _entry("k2", 512), _entry("k3", 64), _entry("only_a", 8)]
    b = [_entry("k1", 256), _entry("k2", 512, warps=8), _entry("k3", 128)]
    result = load_tool("triton_config_diff").compare(a, b, recorded=[_entry("k3", 64)])
    assert (result["compared"], result["same"]) == (2, 1)
    (differ,) = result["differ"]
    assert differ["key_hash"] == "k2"
    assert (differ["a"]["num_warps"], differ["b"]["num_warps"]) == (4, 8)


def test_each_compared_kernels_tuning_seconds_are_listed_longest_first_with_totals():
    a = [_entry("k1", 256, seconds=0.25), _entry("k2", 512, seconds=2.5),
         _entry("k3", 64, seconds=9.0), _entry("k4", 64, seconds=None)]
    b = [_entry("k1", 256, seconds=1.0), _entry("k2", 512, seconds=1.5),
         _entry("k3", 64, seconds=9.0), _entry("k4", 64, seconds=float("nan"))]
    result = load_tool("triton_config_diff").compare(a, b, recorded=[_entry("k3", 64)])
    assert [(s["key_hash"], s["a"], s["b"]) for s in result["seconds"]] == [
        ("k2", 2.5, 1.5), ("k1", 0.25, 1.0), ("k4", None, None)]
    assert result["tune_seconds"] == {"a": 2.75, "b": 2.5}


def test_the_command_line_prints_the_count_and_each_difference(tmp_path, capsys):
    (tmp_path / "a.json").write_text(json.dumps([_entry("k1", 256), _entry("k2", 512)]))
    (tmp_path / "b.json").write_text(json.dumps([_entry("k1", 256), _entry("k2", 1024)]))
    tool = load_tool("triton_config_diff")
    assert tool.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 of 2 kernels tuned to the same config"
    assert "triton_poi_k2" in out[1] and "512" in out[1] and "1024" in out[1]
    assert out[2] == "tuning seconds: 1.00 / 1.00"
    assert out[3:] == ["  triton_poi_k1: 0.50 / 0.50", "  triton_poi_k2: 0.50 / 0.50"]


def test_what_is_not_a_listing_is_a_one_line_error_and_a_fifo_is_not_waited_on(tmp_path,
                                                                                capsys):
    listing = tmp_path / "a.json"
    listing.write_text(json.dumps([_entry("k1", 256)]))
    (tmp_path / "object.json").write_text("{}")
    os.mkfifo(tmp_path / "fifo")
    for bad in ("object.json", "fifo", "missing.json"):
        assert load_tool("triton_config_diff").main([str(listing), str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("triton_config_diff: ") and err.count("\n") == 1
