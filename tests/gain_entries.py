"""Entries with every shape of "what tuning bought" input: written into the frozen database
of schema 0006 (tests/data/schema-0006.db) and into fresh ones, so that stats on an
upgraded database can be compared with stats on a fresh one."""

from __future__ import annotations

from typing import Any

ENV = {"device": "cpu-frozen", "torch": "2.13.0", "triton": "none"}
MOVED = {"from": ["a" * 64], "benchmarked": 3, "generated": 30}

# (key, timings, meta, tune_seconds)
GAIN_ENTRIES: list[tuple[dict[str, Any], dict[str, float], dict[str, Any] | None, float]] = [
    # The entry every frozen database holds (no extern candidate: no baseline).
    ({"kind": "gemm", "op": "mm", "i": 1, "env": ENV}, {"aten": 1.0, "cpp": 3.0}, None, 0.0),
    # GEMM without meta: baseline from the timings.
    ({"kind": "gemm", "op": "mm", "i": 2, "env": ENV},
     {"extern:aten_mm": 4.0, "triton:mm:a": 1.0}, None, 2.0),
    # GEMM with meta, transferred, with a regret.
    ({"kind": "gemm", "op": "bmm", "i": 3, "env": ENV},
     {"extern:aten_bmm": 9.0, "triton:bmm:a": 2.0},
     {"baseline": {"candidate": "extern:aten_bmm", "ms": 10.0}, "best_ms": 2.0,
      "transfer": MOVED, "regret": 1.25}, 3.0),
    # A Triton kernel with meta; one transferred without a baseline.
    ({"kind": "triton_config", "op": "kern", "i": 4, "env": ENV}, {"c1": 1.0, "c2": 1.5},
     {"baseline": {"candidate": "heuristic", "ms": 1.5}, "best_ms": 1.0}, 5.0),
    ({"kind": "triton_config", "op": "kern", "i": 5, "env": ENV}, {"c1": 1.0},
     {"transfer": MOVED}, 1.0),
]


def write(cache: Any) -> None:
    """Publish GAIN_ENTRIES into an open TuneCache."""
    for key, timings, meta, seconds in GAIN_ENTRIES:
        claim = cache.claim(key)
        assert claim is not None
        assert cache.publish(claim, timings, meta=meta, tune_seconds=seconds) is not None
