"""tools/triton_config_diff.py: which Triton kernels two jobs tuned to the same config,
from `tunecache ls --json` listings (a real listing: tests/test_triton_transfer.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parents[1] / "tools" / "triton_config_diff.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("triton_config_diff", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _entry(key: str, xblock: int, warps: int = 4) -> dict[str, object]:
    best = {"XBLOCK": xblock, "num_warps": warps, "num_stages": 1, "found_by_coordesc": True,
            "configs_hash": key * 8, "triton_cache_hash": None}
    return {"key_hash": key, "op": f"triton_poi_{key}", "kind": "triton_config",
            "best": json.dumps(best)}


def test_kernels_are_compared_by_their_config_and_the_recorded_ones_left_out():
    a = [_entry("k1", 256), _entry("k2", 512), _entry("k3", 64), _entry("only_a", 8)]
    b = [_entry("k1", 256), _entry("k2", 512, warps=8), _entry("k3", 128)]
    result = _tool().compare(a, b, recorded=[_entry("k3", 64)])
    assert (result["compared"], result["same"]) == (2, 1)
    (differ,) = result["differ"]
    assert differ["key_hash"] == "k2"
    assert (differ["a"]["num_warps"], differ["b"]["num_warps"]) == (4, 8)


def test_the_command_line_prints_the_count_and_each_difference(tmp_path, capsys):
    (tmp_path / "a.json").write_text(json.dumps([_entry("k1", 256), _entry("k2", 512)]))
    (tmp_path / "b.json").write_text(json.dumps([_entry("k1", 256), _entry("k2", 1024)]))
    assert _tool().main([str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "1 of 2 kernels tuned to the same config"
    assert "triton_poi_k2" in out[1] and "512" in out[1] and "1024" in out[1]
