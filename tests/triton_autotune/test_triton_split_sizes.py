"""tunecache.inductor's Triton section.

The split-size search of a mix-order reduction, split between ranks.

Triton is not installed on the CPU test machines: autotune_helpers.py says how these tests
drive Inductor's own autotune-cache code with fake configs.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from autotune_helpers import (  # noqa: E402
    fusion_key,
    sizes,
    split_size_search,
    stored,
    timing_by_size,
    when_measuring,
)

import tunecache  # noqa: E402
from tunecache.inductor.state import REGISTRY  # noqa: E402
from tunecache.store.claims import Claim  # noqa: E402


def test_the_split_size_search_leaves_a_value_a_peer_is_measuring_to_the_peer(fusion):
    fusion.timing.ms = timing_by_size
    claim = fusion.peer.claim(fusion_key(16))  # the peer measures the start value
    fusion.timing.after_first_step = when_measuring(
        32, lambda: fusion.peer.publish(claim, {"ms": 2.0}))
    best = split_size_search(fusion.benchmark, 0)
    # First round 8, 16, 32: 16 left to the peer; then 32's neighbour 64.
    assert sizes(fusion.measured) == [8, 32, 64] and best == 32
    assert tunecache.stats().triton.fusion_left_to_peer == 1


@pytest.mark.parametrize("peers_ms, best", [(2.0, 32), (0.5, 64)])
def test_while_a_peer_measures_a_split_size_the_next_one_is_measured_here(
        fusion, peers_ms, best):
    # The search goes 8, 16, 32 (first round), then 64: the peer is measuring 64, so this
    # rank measures 128, which the search asks for next if 64 improves on 32.
    fusion.timing.ms = timing_by_size
    claim = fusion.peer.claim(fusion_key(64))
    # The peer's 64 comes in as this rank ends its measurement of 128.
    fusion.timing.after_first_step = when_measuring(
        128, lambda: fusion.peer.publish(claim, {"ms": peers_ms}))
    assert split_size_search(fusion.benchmark, 0) == best
    assert sizes(fusion.completed) == [8, 16, 32, 128]  # 128 once, asked for or not
    assert tunecache.stats().triton.split_values_ahead == 1


def test_a_split_size_measured_ahead_stops_once_the_search_will_not_ask_for_it(fusion):
    fusion.timing.ms = timing_by_size
    claim = fusion.peer.claim(fusion_key(64))
    # The kernel of each module takes 20 coordinate-descent benchmarks. The peer's 64
    # comes in after the first of 128's, no better than 32: the search ends at 32.
    fusion.timing.steps = 20
    fusion.timing.after_first_step = when_measuring(
        128, lambda: fusion.peer.publish(claim, {"ms": 2.0}))
    assert split_size_search(fusion.benchmark, 0) == 32
    assert sizes(fusion.measured) == [8, 16, 32, 128]
    assert sizes(fusion.completed) == [8, 16, 32]  # 128 was stopped
    stats = REGISTRY.triton_stats
    assert (stats.split_values_ahead, stats.split_values_stopped) == (0, 1)
    # Nothing stored for 128 (no inf from the stop), and its claim was given back, not
    # counted as a failed attempt.
    (given_back,) = [row for row in stored(fusion.cache) if row["state"] != "done"]
    assert (given_back["timings_json"], given_back["attempts"]) == (None, 0)
    assert isinstance(fusion.peer.claim(fusion_key(128), wait=0.0), Claim)


def test_a_value_left_to_the_peer_is_not_taken_from_a_search_that_swallows_errors(fusion):
    # Should code between the search and the benchmark turn the "peer is measuring it"
    # signal into a timing (inf), that timing must not decide anything.
    from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner

    fusion.timing.ms = timing_by_size
    claim = fusion.peer.claim(fusion_key(16))  # the peer finds 16 best of all
    fusion.timing.after_first_step = when_measuring(
        32, lambda: fusion.peer.publish(claim, {"ms": 0.5}))

    def swallowing(value: int) -> float:
        try:
            return fusion.benchmark(0, value)[0]
        except Exception:  # noqa: BLE001 - the swallowing this test is about
            return math.inf

    best = CoordescTuner.autotune_single_field(swallowing, 16, 8)
    assert best == 16  # an inf for 16 would have moved the search to 8, then 32
    assert len(fusion.measured) == 2  # 8 and 32: 16 is the peer's
    assert tunecache.stats().triton.fusion_left_to_peer == 1
