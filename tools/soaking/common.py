"""What the workers, the adversary and the driver share: the keys of a run, the graphs, the
event log and a worker's status record."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import time
import zlib
from typing import Any

PG_BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
KEYS_PER_GENERATION = 4  # new keys per GENERATION_SECONDS: a steady stream of cold keys
GENERATION_SECONDS = 1.0
WINDOW = 6  # keys one call may ask for, from the current generation on
# Compiled graphs (hostile mode): one new graph key per generation; a job loads (and, if
# absent, publishes) graphs of the last GRAPH_WINDOW generations, so each is read again by
# many jobs after its first publish.
GRAPH_WINDOW = 5
# Keys of a family (the even ones) start a new family every FAMILY_SECONDS of keys.
FAMILY_SECONDS = 10
# A worker's operation (a call, a graph load or publish) hangs when it waits longer than
# HANG_LEASES leases, not counting its own tuning nor the time it was frozen. The longest
# wait of 10-minute chaos runs with every core busy was 3.2 leases (a dead owner's lease,
# then a peer's retune of 1.3 leases); the wait timeout is max(60 s, 10 leases), 20 leases
# at the default lease, so a job that waits out its whole wait timeout on a claim nobody
# will finish exceeds this bound.
HANG_LEASES = 6.0
HOSTILE_EVERY = 1.0  # seconds between two plants of the adversary (cases by turns)
OPERATOR_EVERY = 4.0  # seconds between two operator commands (stats, ls, prune)
CLI_TIMEOUT = 120.0  # seconds an operator command may take before it counts as hung
STATUS_BYTES = 2048  # a worker's status record (see Status)


def soak_key(run: str, i: int) -> dict[str, Any]:
    return {"kind": "soak", "op": "mm", "run": run, "i": i}


def gemm_inputs(m: int, n: int = 128) -> str:
    """Inductor's ``inputs_key`` of an (m x 256) @ (256 x n) float32 mm on the CPU, the
    text tunecache.inductor.transfer reads sizes from."""
    return repr([("cpu", "torch.float32", m, 256, 256, 1, 0),
                 ("cpu", "torch.float32", 256, n, n, 1, 0)])


def family_mapping(run: str, i: int, m: int, n: int = 128) -> dict[str, Any]:
    """A GEMM key of the family of workload key ``i`` (one family per FAMILY_SECONDS of
    keys, so that every family keeps under the 64 neighbours a key reads)."""
    return {"kind": "gemm", "op": "mm", "run": run,
            "family": i // (KEYS_PER_GENERATION * FAMILY_SECONDS), "inputs": gemm_inputs(m, n)}


def has_family(i: int) -> bool:
    return i % 2 == 0


def workload_key(run: str, i: int) -> Any:
    """The Key of workload number ``i``: an even number is a GEMM key with a family (its
    sizes say which number it is: m = i + 2), whose tuner reads its neighbours first as
    transfer does; an odd one a plain key."""
    from tunecache.inductor.transfer import gemm_family  # torch-free
    from tunecache.keys import Key

    if not has_family(i):
        return Key.of(soak_key(run, i))
    mapping = family_mapping(run, i, i + 2)
    return Key.of(mapping, family=gemm_family(mapping))


def neighbour_key(run: str, i: int, n: int = 129, m: int | None = None) -> Any:
    """A key of the family of (even) workload number ``i``, near it (m = i + 1: odd, so no
    worker asks for it; n tells the adversary's rows apart), that the adversary plants
    as a neighbour jobs will read."""
    from tunecache.inductor.transfer import gemm_family
    from tunecache.keys import Key

    mapping = family_mapping(run, i, i + 1 if m is None else m, n)
    return Key.of(mapping, family=gemm_family(mapping))


CANDIDATES = ("aten", "triton_a", "triton_b")


# The same three as Inductor names GEMM candidates, so that transfer can match them.
GEMM_CANDIDATES = ("extern:mm", "triton:mm:BLOCK_M=32, BLOCK_N=32, num_warps=4",
                   "triton:mm:BLOCK_M=64, BLOCK_N=64, num_warps=4")


def timings_for(pid: int, i: int) -> dict[str, float]:
    """Deterministic per (process, key) and different between processes: a key tuned
    twice, or a result taken from the wrong tuner, shows as a difference."""
    rng = random.Random(f"{pid}:{i}")
    names = GEMM_CANDIDATES if has_family(i) else CANDIDATES
    return {name: round(rng.uniform(0.1, 2.0), 6) for name in names}


def with_transfer_meta(cache: Any, key: Any, timings: dict[str, float]) -> tuple[Any, bool]:
    """What a transfer tuner does with a key of a family: read its neighbours, plan from
    them (tunecache.inductor.transfer, as a GEMM lookup does), and store the plan and
    the untuned baseline as meta. (Tuned timings, whether a plan was found.)"""
    from tunecache import Tuned
    from tunecache.inductor.transfer import baseline_meta, plan_transfer

    plan = plan_transfer(key.mapping, cache.neighbours(key))
    meta = baseline_meta(timings)
    if plan is not None:
        meta.update(plan.meta(sum(map(plan.keeps, timings)), len(timings)))
    return Tuned(timings, meta), plan is not None


class EventLog:
    """Append-only JSON lines, one file per process; one write(2) per line, so a SIGKILL
    never leaves half a line behind another."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **record: Any) -> None:
        os.write(self._fd, (json.dumps(record) + "\n").encode())


def graph_key(run: str, i: int) -> tuple[str, str]:
    """(kind, key) of the soak's compiled graph number ``i``."""
    return ("fxgraph" if i % 2 else "autograd"), f"soak-{run}-graph-{i}"


def graph_payload(run: str, i: int) -> bytes:
    """The bytes every job "compiles" for graph ``i``: a load must return exactly these."""
    rng = random.Random(f"{run}:graph:{i}")
    return rng.randbytes(rng.randint(1024, 64 * 1024))


def graph_digest(run: str, i: int) -> str:
    """The blob digest of graph ``i`` as a publisher stores it (zlib at GraphShare's level),
    so that the adversary can plant files where that blob and its locks will go."""
    from tunecache.core import graphs

    level = getattr(graphs, "_LEVEL", 6)
    return hashlib.sha256(zlib.compress(graph_payload(run, i), level)).hexdigest()


def generation(spec: dict[str, Any], at: float | None = None) -> int:
    return int(((time.time() if at is None else at) - spec["t0"]) / GENERATION_SECONDS)


class Status:
    """What a worker is doing now, rewritten in place (one pwrite of a fixed-size record)
    so that the driver can see an operation that never returns (a blocking open of a
    FIFO, a wait on a claim that never ends) and kill the worker."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.op: dict[str, Any] | None = None

    def begin(self, op: str, **what: Any) -> None:
        self.op = {"op": op, "start": time.time(), "tuned": 0.0, "tune_since": None, **what}
        self._write()

    def tune(self, started: bool) -> None:
        if self.op is None:
            return
        now = time.time()
        if started:
            self.op["tune_since"] = now
        elif self.op["tune_since"] is not None:
            self.op["tuned"] += now - self.op["tune_since"]
            self.op["tune_since"] = None
        self._write()

    def end(self) -> float:
        """The operation's own tuning seconds."""
        tuned = self.op["tuned"] if self.op else 0.0
        self.op = None
        self._write()
        return float(tuned)

    def _write(self) -> None:
        data = json.dumps(self.op).encode()[: STATUS_BYTES - 1]
        os.pwrite(self._fd, data.ljust(STATUS_BYTES, b" "), 0)


def read_status(logdir: str, pid: int) -> dict[str, Any] | None:
    try:
        with open(os.path.join(logdir, f"status-{pid}"), "rb") as f:
            value = json.loads(f.read(STATUS_BYTES) or b"null")
    except (OSError, ValueError):
        return None  # not written yet, or read mid-write: next look
    return value if isinstance(value, dict) else None


def read_plants(logdir: str) -> list[dict[str, Any]]:
    path = os.path.join(logdir, "plants.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
