"""Real Inductor objects around fake kernels, for testing tunecache.inductor without a GPU.

The CPU C++ backend never defers autotuning (no ``MultiTemplateBuffer`` on CPU unless
``cpu_backend="triton"``, which needs triton), so the deferred path is driven here with
real ``SchedulerNode``/``MultiTemplateBuffer`` instances whose timing function does what
Inductor's ``get_timings`` does: ``selector.lookup(choices, op, inputs_key, benchmark)``.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from typing import Any

import torch
from torch._inductor import config, ir
from torch._inductor.scheduler import SchedulerNode
from torch._inductor.select_algorithm import get_algorithm_selector_cache

CPU_LAYOUT = types.SimpleNamespace(device=torch.device("cpu"))


class FakeChoice(ir.ChoiceCaller):
    """A candidate kernel identified by its name (like an extern kernel's hash_key)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, [], CPU_LAYOUT, "")  # type: ignore[arg-type]

    def hash_key(self) -> str:
        return self.name


def fake_benchmark(
    log: list[list[str]], times: dict[str, float], delay: float = 0.0
) -> Callable[[list[Any]], dict[Any, float]]:
    """Inductor's benchmark callable: records what it was asked to time."""

    def benchmark(choices: list[Any]) -> dict[Any, float]:
        log.append([c.name for c in choices])
        if delay:
            time.sleep(delay)  # a benchmark that takes time: the behaviour, not a wait
        return {c: times.get(c.name, 1.0) for c in choices}

    return benchmark


def lookup(choices: list[Any], op: str, inputs_key: str, benchmark: Any) -> dict[Any, float]:
    """What do_autotuning calls (through our hook when enabled)."""
    return get_algorithm_selector_cache().lookup(choices, op, inputs_key, benchmark)


def deferred_node(
    op: str, inputs_key: str, names: list[str], benchmark: Callable[[list[Any]], Any]
) -> SchedulerNode:
    """A scheduler node holding a MultiTemplateBuffer, lowered the way __call__ does it:
    make_precompile_fn(choices, ...) first, then the buffer with the same choices list."""
    choices = [FakeChoice(n) for n in names]
    selector = get_algorithm_selector_cache()
    selector.make_precompile_fn(choices, op, inputs_key)
    buf = ir.MultiTemplateBuffer.__new__(ir.MultiTemplateBuffer)
    buf._choices = choices
    buf._choice_timings = {}
    buf._choice_timings_fn = lambda hint_override=None: selector.lookup(
        choices, op, inputs_key, benchmark
    )
    node = SchedulerNode.__new__(SchedulerNode)
    node.node = buf
    return node


def run_scheduler(nodes: list[SchedulerNode]) -> list[dict[str, float]]:
    """The scheduler's order: the pre-fusion pass, then fusion asks every buffer."""
    if config._pre_fusion_custom_pass is not None:
        nodes = config._pre_fusion_custom_pass(nodes)
    return [
        {c.name: t for c, t in n.node.choice_timings().items()}  # type: ignore[union-attr]
        for n in nodes
    ]
