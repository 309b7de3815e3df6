"""Shared by tests/test_cli_*.py: populate a database through the real API, run the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from click.testing import CliRunner, Result

import tunecache
from tunecache.cli import cli


def gemm_key(op: str = "mm", i: int = 0, torch: str = "2.13.0", device: str = "cpu-x",
             triton: str = "none") -> dict[str, Any]:
    return {"kind": "gemm", "op": op, "env": {"device": device, "torch": torch,
                                              "triton": triton}, "inputs": i}


def timings_for(key: dict[str, Any]) -> dict[str, float]:
    i = key.get("inputs")
    return {"aten": 1.0 + (i if isinstance(i, int) else 0) * 0.25, "triton": 2.0}


def populate(url: str, keys: Iterable[dict[str, Any]], hits: int = 0) -> list[tunecache.Result]:
    """Tune ``keys`` (fake timings) through TuneCache; ``hits`` lookups of each afterwards."""
    keys = list(keys)
    with tunecache.open(url) as cache:
        results = cache.get_or_tune_many(keys, lambda key: timings_for(key.mapping))
        for _ in range(hits):
            for key in keys:
                cache.lookup(key)
    return results


def fail_key(url: str, key: dict[str, Any]) -> None:
    """Mark ``key`` failed: its tuner raises and max_attempts is 1."""
    with tunecache.open(url, max_attempts=1) as cache:
        try:
            cache.get_or_tune_many([key], _raise)
        except RuntimeError:
            pass


def _raise(_key: Any) -> dict[str, float]:
    raise RuntimeError("kernel crashed")


def claim_key(url: str, key: dict[str, Any], lease_seconds: float,
              owner: str = "host:1:abc") -> None:
    """Leave a claim on ``key``, as a tuning (or dead, if the lease is tiny) process does."""
    import procs

    from tunecache.keys import Key

    k = Key.of(key)
    with tunecache.open(url) as cache:
        cache.lookup(key)  # creates the schema
        cache.store.step(publish=[], candidates=[k], limit=1,
                         owner=owner, lease_seconds=lease_seconds, max_attempts=3)
        if lease_seconds < 1:  # dead: wait until the database says its lease has passed
            procs.wait_until(lambda: cache.store.read([k.hash])[k.hash].lease_expired,
                             "the claim's lease passing")


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def strict_json(text: str) -> Any:
    """json.loads refusing the non-standard tokens NaN, Infinity and -Infinity."""

    def refuse(token: str) -> Any:
        raise ValueError(f"{token} is not standard JSON")

    return json.loads(text, parse_constant=refuse)


def run_json(*args: str) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)
