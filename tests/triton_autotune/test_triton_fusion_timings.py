"""tunecache.inductor's Triton section.

Fusion benchmarks: measured once in a job and read by every later rank.

Triton is not installed on the CPU test machines: autotune_helpers.py says how these tests
drive Inductor's own autotune-cache code with fake configs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from autotune_helpers import (  # noqa: E402
    fusion_key,
    publish_while_waiting,
    stored,
)

import tunecache  # noqa: E402
from tunecache import inductor as tc_inductor  # noqa: E402
from tunecache.store.claims import Claim  # noqa: E402


def test_a_fusion_benchmark_is_measured_once_and_read_by_every_later_rank(fusion):
    ms, path = fusion.benchmark(0)
    assert ms == 0.25 and path.endswith("kernel.py") and len(fusion.measured) == 1
    fusion.timing.ms = 9.0  # a second measurement would differ
    assert fusion.benchmark(1)[0] == 0.25  # another GPU: the stored timing, not run
    assert len(fusion.measured) == 1
    assert fusion.benchmark(0, size=2048)[0] == 9.0  # another module is measured
    stats = tunecache.stats().triton.as_dict()
    assert (stats["fusion_hits"], stats["fusion_measured"]) == (1, 2)
    kinds = {r["kind"] for r in stored(fusion.cache)}
    assert kinds == {"fusion_benchmark"}


def test_a_fusion_benchmark_a_peer_is_running_is_waited_for_not_run(fusion):
    claim = fusion.peer.claim(fusion_key())  # rank 1 is measuring it
    # Three reads: the lookup, the claim's, and one while waiting.
    peer = publish_while_waiting(fusion.cache,
                                  lambda: fusion.peer.publish(claim, {"ms": 0.125}), reads=3)
    ms, _ = fusion.benchmark(0)
    peer.join(60)
    assert ms == 0.125 and fusion.measured == []  # the peer's timing decides, here too
    assert tunecache.stats().triton.peer_wait_seconds > 0


def test_a_fusion_benchmark_that_raises_gives_its_key_back_at_once(fusion):

    def broken(_file: str) -> float:
        raise RuntimeError("no valid triton configs")

    fusion.timing.ms = broken
    with pytest.raises(RuntimeError, match="no valid triton configs"):
        fusion.benchmark(0)
    assert isinstance(fusion.peer.claim(fusion_key(), wait=0.0), Claim)  # no lease to wait


def test_a_negative_fusion_timing_is_shared_as_zero(fusion):
    # Inductor subtracts the cost of cloning mutated inputs, which can exceed the run.
    fusion.timing.ms = -0.01
    assert fusion.benchmark(0)[0] == 0.0
    assert fusion.benchmark(1)[0] == 0.0 and len(fusion.measured) == 1


def test_a_garbled_fusion_timing_is_measured_again(fusion):
    fusion.benchmark(0)
    key = tc_inductor.fusion_benchmark_key(Path(fusion.measured[0]).read_text(), 8)
    from sqlalchemy import update

    from tunecache.store.schema import entries

    fusion.cache.store.db.run(lambda c: c.execute(
        update(entries).values(timings_json='{"fastest": 0.0}')), write=True)
    assert fusion.peer.lookup(key) is not None  # valid timings, but not a fusion timing
    fusion.timing.ms = 0.5
    assert fusion.benchmark(1)[0] == 0.5 and len(fusion.measured) == 2
