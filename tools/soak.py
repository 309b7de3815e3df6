"""Soak test: workers claim and publish through the public API while a chaos driver SIGKILLs
them, SIGSTOPs crowds of them, restarts PostgreSQL and terminates its backends.

    python tools/soak.py --minutes 10 --backend both --workers 8

Each worker process runs "jobs" (``tunecache.open`` ... ``close``) of ``get_or_tune`` and
``get_or_tune_many`` calls on a moving window of keys that all workers share. Its tuner
sleeps (now and then longer than the lease, so only the heartbeat keeps the claim) and
returns timings drawn from a generator seeded by (pid, key): two processes that both tune
one key return different timings, so any divergence shows. Outside tunecache, each worker
appends to its own JSONL file every tune it starts and every call's results; the driver
records every kill, freeze, restart and termination, and a probe thread records every
window in which the database could not be written (a server restart, or on SQLite a
frozen process holding the write lock). At the end the driver reads the stored entries
and prints:

- keys: distinct keys asked for; calls; tunes under a claim, and local ones (fallbacks);
- kills (some in storms), freezes (shorter and longer than the lease), PostgreSQL
  restarts and backend terminations;
- takeovers: claims taken from an owner whose lease had passed (sum of token - 1);
- duplicate tunes by live owners: a key whose previous tuner was neither killed, nor
  frozen for lease/2 or more, nor cut off by a database outage of lease/2 or more,
  between its tune and the next one (an owner renews every lease/3, so nothing shorter
  can cost it its lease);
- divergent results: a hit, tuned or peer result whose timings differ from the stored
  entry's (so two callers disagree, or a caller disagrees with the store);
- callers that raised (a KeyFailedError is counted as failed instead), worker crashes,
  and workers still running well after the end (hung);
- the longest wait: the longest single call, less the time its own caller was frozen.

Exits 1 if duplicates by live owners, divergent results, raised callers, crashes or hung
workers are not all zero, or if an invariant of the hostile soak fails.

    python tools/soak.py --seconds 600 --backend both          # --no-hostile: chaos only

Hostile soak (on unless ``--no-hostile``). Beside the workers, an adversary process writes
the shared storage as anyone who can, without the private key, planting one case every
HOSTILE_EVERY (1) second by turns, aimed at the keys and graphs the workers will ask for
next; an operator thread runs the CLI; and jobs also share compiled graphs through
``tunecache.core.graphs`` (a key pair made with ``write_key_pair``; most jobs sign and
publish, some only verify, one in ten is handed the world-writable key file below). The
cases, by name (``*`` SQLite only: PostgreSQL keeps payloads in the row):

- ``lease_far_future``: claims whose lease ends in 1e300 s or at 9999-12-31;
- ``lease_nan``: a NaN lease (SQLite stores a NaN bound from Python as NULL);
- ``lease_negative``: leases of -1 and -1e300 (already expired: taken over);
- ``lease_wrong_type``: SQLite: text and bytes leases, a text token; PostgreSQL's float8
  column has no wrong type, so its nearest, +inf and -inf;
- ``garbled_timings``: done rows whose timings are broken JSON, JSON of the wrong shape,
  NaN, or start with an escape sequence;
- ``hostile_names``: a done entry and a graph row whose names (kind, op, device, torch and
  triton versions, key, winner) hold terminal escape sequences, CR, newlines, a
  right-to-left override and, where the database takes them (SQLite), NUL and a lone
  surrogate as invalid UTF-8; half of them dated 2001, for ``prune --older-than``;
- ``graph_size_2gib``, ``graph_size_negative``, ``graph_size_int64_max``: graph rows
  declaring payloads of 2 GiB, -10**18 and 2**63-1 bytes (with a 512-byte payload);
- ``blob_fifo``*: the blob of a graph jobs are loading replaced by a FIFO with no writer;
- ``blob_shard_symlink``* and ``keys_shard_symlink``*: a blob shard directory
  (``<db>.blobs/ab``) or a publishers' lock shard (``<db>.blobs/keys/ab``) of a graph
  about to be published replaced by a symlink to a canary folder outside the cache, with
  files dated 2001 named like orphan blobs, stale locks and leftovers of writers;
- ``lock_symlink``*: the blob lock and the publishers' lock of a graph about to be
  published replaced by symlinks to canary files (mode 640) outside the cache;
- ``verify_key_world_writable``: a copy of the verify key, mode 666, that some jobs are
  handed (as TUNECACHE_VERIFY_KEY): they must refuse it;
- ``huge_int_timings``: a done row whose timings hold a 310-digit integer, as a neighbour
  of the next key of a family and as the own row of another key jobs will ask for;
- ``huge_int_meta``: a neighbour whose meta holds 310-digit numbers (baseline.ms, best_ms);
- ``huge_transfer_benchmarked``: two neighbours whose meta's ``transfer.benchmarked`` has
  4300 digits (their sum is past Python's int-to-text limit);
- ``nan_meta``: neighbours whose meta holds the tokens NaN, Infinity and -Infinity;
- ``oversize_meta``, ``oversize_timings``: two neighbours each with 4 MiB of meta or
  timings (the limits are keys.MAX_META_BYTES, 64 KiB, and MAX_TIMINGS_BYTES, 1 MiB);
  planted on one turn of the cases in RARE_EVERY (3), to keep the database small;
- ``hits_crowding``: 70 neighbours (more than the 64 a key reads), 6 octaves from the key
  in size, with an enormous hits count (2**62; 2**31-1 in PostgreSQL's int4 column), so
  they are read before any genuine neighbour (slower tuning, never a wrong one);
- ``family_escape``: a done row whose family holds terminal escapes, CR and a newline.

The neighbour cases (``huge_*``, ``nan_meta``, ``oversize_*``, ``hits_crowding``) write
rows of the family of an even key jobs will ask for next: even keys are GEMM keys with a
family (a new family every FAMILY_SECONDS of keys), and their tuner does what transfer
does before tuning: ``TuneCache.neighbours``, then ``plan_transfer`` and ``baseline_meta``
of tunecache.inductor.transfer, stored as the entry's meta. The key such a row aims at is
not written by the adversary: if it fails, the row charged someone else's key.

The operator runs ``tunecache stats``, ``ls``, ``ls --graphs`` (also with ``--json``),
``prune --max-graph-bytes 256KiB --older-than 30d`` (and a ``--dry-run``), ``show`` of a
row the adversary planted (of each case by turns), ``export -o FILE`` (also
``--best-only``) and ``prune --invalid --dry-run``, one every OPERATOR_EVERY (4) seconds,
each a subprocess in its own session under CLI_TIMEOUT (120 s), with the operator's
environment (none of the workers' TUNECACHE_* settings); after the workers stop, a last
prune, ``ls --graphs``, ``stats``, ``stats --json``, ``show``, ``prune --invalid
--dry-run`` and both exports. A command passes if it exits 0 with output free of raw
control characters (``--json`` output and an export file: strict JSON, which has no NaN
or Infinity), or, while the chaos runs, exits 1 or 2 with a one-line error (counted as an
error, not a failure: the database may be down); a traceback, any other exit status, a
raw control character, or an error in the last round (a quiet database) is a failure,
and a timeout a hang.

A watchdog reads each worker's status record (one pwrite of what it is doing: a call and
its keys, a graph load or publish, a key file) twice a second; an operation that has
waited longer than HANG_LEASES (6) leases, its own tuning and the time it was frozen not
counted, is a hang, and the worker is killed with its process group (and replaced). The
same bound is applied to every operation that did return. So a hang in tunecache never
hangs the soak: every process it starts is in a session of its own under a bound, and
SIGINT/SIGTERM kill them all and remove the temp dir and the private PostgreSQL cluster.

The invariants, printed per backend with counts per case (planted, skipped, failed,
hung, touched, keys failed; the keys a plant aimed at attribute failures and hangs to it,
and the rest are ``normal``), then one JSON summary line (``{"soak_summary": backend,
...}``):

- **jobs failed**: jobs (one ``tunecache.open`` ... ``close`` of a worker) in which a call
  raised, a graph load or publish raised or returned other bytes than were published, or
  the world-writable verify key was accepted; and each duplicate by a live owner,
  divergent result and worker crash;
- **keys failed that no one tampered with**: entries in state ``failed`` at the end whose
  row the adversary never wrote (it logs the hash of every row it writes); each is named.
  Workers run with TUNECACHE_MAX_ATTEMPTS ``--max-attempts`` (10): chaos alone does not
  exhaust a key, a tuner that raises on every job does;
- **CLI commands failed**: operator commands that failed (a traceback, raw control
  characters, output or an export file that is not strict JSON, another exit status);
- **files outside the cache touched**: canary files deleted, no longer plain files, or
  changed in content or mode, and files created in a canary folder;
- **hangs**: operations past the hang bound, workers still running at the end, operator
  commands past CLI_TIMEOUT.

Keys the adversary wrote rows for are left out of the duplicate and divergence checks:
their stored rows are the adversary's.

PostgreSQL: by default a private throwaway cluster (initdb into a temp dir, as the
``postgres`` user when run as root, on a free port), restarted at will and removed at the
end; the shared server on 5432 is never touched. ``--pg-url`` uses an existing server
instead: backends are still terminated, but restarts need ``--pg-restart-cmd``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import hashlib
import itertools
import json
import logging
import os
import random
import re
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tunecache
from tunecache.keys import key_hash

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


# -- the worker ----------------------------------------------------------------------------


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


class Worker:
    """A worker process: jobs (open, one to four calls, in hostile mode a few graph loads
    and publishes, close) until the deadline. Its settings are the TUNECACHE_* variables
    the driver set."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.pid = os.getpid()
        self.rng = random.Random(f"{spec['seed']}:{self.pid}")
        self.log = EventLog(os.path.join(spec["logdir"], f"events-{self.pid}.jsonl"))
        self.status = Status(os.path.join(spec["logdir"], f"status-{self.pid}"))
        self.lease = float(os.environ["TUNECACHE_LEASE_SECONDS"])
        self.calls = 0
        self.job = 0  # jobs (open ... close) this worker started

    def run(self) -> None:
        while time.time() < self.spec["deadline"]:
            self.job += 1
            start = time.time()
            cache = tunecache.open(self.spec["url"])
            # A job with a nearly free tuner (a warm local cache, say) makes
            # get_or_tune_many claim keys in batches; one slow key among them must not
            # cost the others their leases.
            cheap = self.rng.random() < 0.3
            for _ in range(self.rng.randint(1, 4)):
                if time.time() >= self.spec["deadline"]:
                    break
                self.call(cache, cheap)
            if self.spec.get("keys") and time.time() < self.spec["deadline"]:
                self.graphs(cache)
            try:
                cache.close()
            except Exception as e:  # noqa: BLE001 - counted like a call that raised
                self.log.write(ev="call", pid=self.pid, job=self.job, call=-1,
                               start=time.time(), end=time.time(), results={}, keys=[],
                               tuning=0.0, raised=f"close: {e!r}")
            # The peak RSS so far: a neighbour read that fetches oversize rows shows here.
            self.log.write(ev="job", pid=self.pid, job=self.job, start=start, end=time.time(),
                           rss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

    def call(self, cache: Any, cheap: bool) -> None:
        """One get_or_tune or get_or_tune_many on keys of the moving window; logs the
        results, or what it raised."""
        self.calls += 1
        call, rng = self.calls, self.rng
        first = generation(self.spec) * KEYS_PER_GENERATION + rng.randint(0, 2)
        numbers = list(range(first, first + rng.randint(1, WINDOW * (4 if cheap else 1))))
        one = rng.random() < 0.5
        if one:
            numbers = [rng.choice(numbers)]

        keys = [workload_key(self.spec["run"], i) for i in numbers]
        number_of = {k.hash: i for k, i in zip(keys, numbers)}
        key_of = {k.hash: k for k in keys}

        def tune(mapping: Any) -> dict[str, float]:
            key = key_of[key_hash(mapping)[0]]
            i = number_of[key.hash]
            self.log.write(ev="tune", pid=self.pid, job=self.job, call=call, i=i,
                           t=time.time(), local=cache.disabled_reason is not None)
            self.status.tune(started=True)
            try:
                timings = timings_for(self.pid, i)
                if key.family is not None:  # what a transfer tuner reads first
                    timings, planned = with_transfer_meta(cache, key, timings)
                    self.log.write(ev="plan", pid=self.pid, job=self.job, i=i, planned=planned)
                # Now and then longer than the lease: only the heartbeat keeps the claim.
                if rng.random() < (0.03 if cheap else 0.15):
                    time.sleep(1.3 * self.lease)
                else:
                    time.sleep(0.0005 if cheap else rng.uniform(0.05, 0.3))
            finally:
                self.status.tune(started=False)
            return timings

        start, raised, results = time.time(), None, {}
        self.status.begin("call", keys=numbers)
        try:
            if one:
                found = [cache.get_or_tune(keys[0], lambda: tune(keys[0].mapping))]
            else:
                found = cache.get_or_tune_many(keys, tune)
            results = {str(i): [r.source, r.timings] for i, r in zip(numbers, found)}
        except tunecache.KeyFailedError:
            results = {str(numbers[0]): ["failed", None]}
        except Exception as e:  # noqa: BLE001 - a caller that raised is what we count
            raised = f"{type(e).__name__}: {e}"
        tuning = self.status.end()
        self.log.write(ev="call", pid=self.pid, job=self.job, call=call, start=start,
                       end=time.time(), results=results, keys=numbers, tuning=round(tuning, 4),
                       raised=raised)

    def graphs(self, cache: Any) -> None:
        """Compiled graphs as Inductor shares them: set up graph sharing from the job's
        key file (mostly the private key; some jobs are consumers with the public key,
        and some are handed the world-writable copy the adversary keeps, which they must
        refuse), then load graphs of the window and publish those absent."""
        from tunecache.core.graphs import GraphShare
        from tunecache.errors import SigningKeyError
        from tunecache.settings import Settings

        keys, roll = self.spec["keys"], self.rng.random()
        if roll < 0.1 and os.path.exists(keys["hostile_verify"]):
            role, files = "hostile_key", {"verify_key": keys["hostile_verify"]}
        elif roll < 0.3:
            role, files = "consumer", {"verify_key": keys["verify"]}
        else:
            role, files = "publisher", {"signing_key": keys["signing"]}
        self.status.begin("keyfile", role=role)
        start, raised, share = time.time(), None, None
        try:
            plan = Settings.from_env(db=self.spec["url"], **files).graph_sharing()
            share = GraphShare.from_settings(plan, lambda: cache)
        except SigningKeyError:
            pass  # refused: the job shares tuning only, as it should
        except Exception as e:  # noqa: BLE001 - a job that raised is what we count
            raised = f"{type(e).__name__}: {e}"
        self.status.end()
        self.log.write(ev="keyfile", pid=self.pid, job=self.job, role=role, start=start,
                       end=time.time(), accepted=share is not None, raised=raised)
        if share is None:
            return
        top = generation(self.spec)
        for _ in range(self.rng.randint(1, 3)):
            if time.time() >= self.spec["deadline"]:
                break
            self.graph(share, self.rng.randint(max(0, top - GRAPH_WINDOW), top))

    def graph(self, share: Any, i: int) -> None:
        kind, key = graph_key(self.spec["run"], i)
        start, raised, outcome, wrong = time.time(), None, "absent", False
        self.status.begin("graph", graph=i)
        try:
            data = share.load(kind, key)
            if data is not None:
                outcome, wrong = "loaded", data != graph_payload(self.spec["run"], i)
            elif share.publishes and share.publish(kind, key, graph_payload(self.spec["run"], i),
                                                   "soak"):
                outcome = "published"
        except Exception as e:  # noqa: BLE001 - GraphShare promises never to raise
            raised = f"{type(e).__name__}: {e}"
        self.status.end()
        self.log.write(ev="graph", pid=self.pid, job=self.job, graph=i, start=start,
                       end=time.time(), outcome=outcome, wrong=wrong, raised=raised)


def run_worker(spec: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops us, not the terminal
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(message)s")
    Worker(spec).run()


# -- a private PostgreSQL cluster ------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """A throwaway cluster in a temp dir on a free port; initdb refuses root, so as root it
    runs as the ``postgres`` user."""

    def __init__(self) -> None:
        if not PG_BIN:
            raise SystemExit("soak: no PostgreSQL binaries under /usr/lib/postgresql/*/bin; "
                             "use --pg-url or --backend sqlite")
        self.bin = PG_BIN[-1]
        self.dir = tempfile.mkdtemp(prefix="tunecache-soak-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> list[str]:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir}"
        return [*self.as_user, f"{self.bin}/pg_ctl", "-D", self.data, "-o", options,
                "-l", os.path.join(self.dir, "server.log"), "-w", "-t", "60", *args]

    def start(self) -> None:
        for argv in ([*self.as_user, f"{self.bin}/initdb", "-D", self.data, "-A", "trust",
                      "-U", "postgres", "--no-sync"], self._pg_ctl("start")):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode:
                why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
                raise SystemExit(f"soak: {' '.join(argv[:4])} ... failed: {why[0]}")

    def restart_command(self, mode: str) -> list[str]:
        return self._pg_ctl("-m", mode, "restart")

    def stop(self) -> None:
        subprocess.run(self._pg_ctl("-m", "immediate", "stop"), capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- watching the database -----------------------------------------------------------------


def libpq_url(url: str) -> str:
    """The URL as psycopg takes it (no SQLAlchemy driver suffix)."""
    scheme, rest = url.split("://", 1)
    return f"postgresql://{rest}" if scheme.startswith("postgres") else url


class OutageProbe(threading.Thread):
    """Writes to the database every 0.1 s from the driver; a gap of over 0.5 s between two
    successes is an outage (a restart, or on SQLite a frozen writer holding the lock)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="soak-probe", daemon=True)
        self.url = url
        self.outages: list[tuple[float, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        last_ok = time.time()
        conn: Any = None
        while not self._halt.wait(0.1):
            try:
                if conn is None:
                    conn = self._connect()
                self._touch(conn)
            except Exception:  # noqa: BLE001 - down is what we measure; reconnect next time
                conn = None
                continue
            now = time.time()
            if now - last_ok > 0.5:
                self.outages.append((last_ok, now))
            last_ok = now

    def _connect(self) -> Any:
        if self.url.startswith("sqlite"):
            return sqlite3.connect(self.url.split("///", 1)[1], timeout=600,
                                   isolation_level=None)
        import psycopg

        return psycopg.connect(libpq_url(self.url), autocommit=True, connect_timeout=2,
                               application_name="tunecache-soak-probe")

    def _touch(self, conn: Any) -> None:
        if isinstance(conn, sqlite3.Connection):
            conn.execute("BEGIN IMMEDIATE")  # the lock every tunecache write takes
            conn.execute("ROLLBACK")
        else:
            conn.execute("SELECT 1")

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


def terminate_backends(url: str, rng: random.Random) -> int:
    """pg_terminate_backend on about half of tunecache's connections to the soak's database
    (whatever else uses that database is left alone)."""
    import psycopg

    with psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=2) as conn:
        pids = [row[0] for row in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND application_name LIKE 'tunecache%' "
            "AND application_name <> 'tunecache-soak-probe'")]
        chosen = rng.sample(pids, (len(pids) + 1) // 2)
        for pid in chosen:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return len(chosen)


# -- the adversary: hostile rows and files -----------------------------------------------------

# Cases the adversary plants, by turns; those of blob files exist only beside a SQLite
# database (PostgreSQL keeps payloads in the row).
CASES = [
    "lease_far_future", "graph_size_2gib", "blob_fifo", "lease_nan", "hostile_names",
    "blob_shard_symlink", "lease_negative", "graph_size_negative", "keys_shard_symlink",
    "garbled_timings", "lease_wrong_type", "lock_symlink", "graph_size_int64_max",
    "verify_key_world_writable",
]
# The cases of neighbour rows (and of huge numbers and oversize text in a stored column).
CASES += ["huge_int_timings", "huge_int_meta", "huge_transfer_benchmarked", "nan_meta",
          "hits_crowding", "family_escape", "oversize_meta", "oversize_timings"]
# A few MiB of text each: planted on one turn of the cases in RARE_EVERY, so that the
# database stays small (a key's meta may have 64 KiB, its timings 1 MiB).
RARE = {"oversize_meta", "oversize_timings"}
RARE_EVERY = 3
OVERSIZE_BYTES = 4 * 2**20
NEIGHBOUR_TIMINGS = json.dumps({GEMM_CANDIDATES[0]: 0.5, GEMM_CANDIDATES[1]: 0.25})
HUGE_310 = "1" + "0" * 309  # a JSON integer of 310 digits: float() of it overflows


def raw_json(value: Any, **raw: str) -> str:
    """The JSON text of ``value``, each string ``"@name@"`` in it replaced by the text
    ``raw[name]``: what no encoder writes (a 4300-digit integer, NaN)."""
    text = json.dumps(value)
    for name, replacement in raw.items():
        text = text.replace(json.dumps(f"@{name}@"), replacement)
    return text
SQLITE_ONLY = {"blob_fifo", "blob_shard_symlink", "keys_shard_symlink", "lock_symlink"}
OLD = 1_000_000_000.0  # 2001-09-09: the mtime of canary files and old hostile rows
_ENTRY_COLUMNS = ("key_hash", "key_json", "kind", "op", "device", "torch_version",
                  "triton_version", "state", "owner", "token", "lease_expires_at", "attempts",
                  "timings_json", "best", "tune_seconds", "error", "created_at", "updated_at",
                  "last_used_at", "hits", "family", "meta_json")
_ARTIFACT_COLUMNS = ("kind", "cache_key", "digest", "signature", "size", "torch_version",
                     "created_at", "last_used_at", "payload")


class RawText(bytes):
    """Bytes that SQLite is to store as TEXT as they are (invalid UTF-8: a lone surrogate
    encoded as a C writer would), which Python's sqlite3 cannot bind as a str."""


def _upsert(table: str, columns: tuple[str, ...], conflict: str, row: dict[str, Any],
            pg: bool) -> tuple[str, list[Any]]:
    """An INSERT that overwrites the row of the same identity: the adversary writes what
    it likes, where it likes."""
    marks = ["CAST(? AS TEXT)" if isinstance(row[c], RawText) else "?" for c in columns]
    keep = set(conflict.split(", "))
    sql = (f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(marks)}) "
           f"ON CONFLICT ({conflict}) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in columns if c not in keep))
    params = [bytes(row[c]) if isinstance(row[c], RawText) else row[c] for c in columns]
    return (sql.replace("?", "%s") if pg else sql), params


class Adversary:
    """Writes the shared storage as anyone who can, without the private key: hostile rows
    in the database, and on SQLite FIFOs and symlinks among the blob files, pointing at
    "canary" files outside the cache that nothing may touch. Every plant is one line of
    ``plants.jsonl``: its case, the workload keys and graphs it aims at, and the canary
    files it made (path, sha256, mode) for the check at the end."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.pg = spec["url"].startswith("postgresql")
        self.rng = random.Random(f"{spec['seed']}:adversary")
        self.log = EventLog(os.path.join(spec["logdir"], "plants.jsonl"))
        self.blobs: str = spec.get("blobs") or ""  # SQLite's blob root ("" on PostgreSQL)
        self.planted: dict[str, set[int]] = {"keys": set(), "graphs": set()}
        self.made = 0
        self.rows: list[str] = []  # hashes of the entry rows the plant under way wrote

    def run(self) -> None:
        cases = [c for c in CASES if not (self.pg and c in SQLITE_ONLY)]
        # The key file first, so that jobs handed it find it from the start.
        cases.remove("verify_key_world_writable")
        cases.insert(0, "verify_key_world_writable")
        n = 0
        while time.time() < self.spec["deadline"]:
            case = cases[n % len(cases)]
            n += 1
            if case in RARE and (n - 1) // len(cases) % RARE_EVERY:
                continue  # planted on one turn of the cases in RARE_EVERY
            self.rows = []
            try:
                record = getattr(self, case)()
            except Exception as e:  # noqa: BLE001 - a plant that did not take is skipped
                record = {"skipped": f"{type(e).__name__}: {e}"[:300]}
            # Every row written, whether the plant took or not (a statement may have run).
            self.log.write(case=case, t=time.time(), rows=self.rows, **record)
            time.sleep(HOSTILE_EVERY)

    # -- targets

    def _upcoming(self, count: int, what: str = "keys", family: bool = False) -> list[int]:
        """Workload numbers (keys or graphs) no job has asked for yet, but soon will. Keys
        are asked for only in their generation's second, by calls that start at one of
        its first three keys, so the third key of each of the next generations comes
        first: one key per generation, since a second in which no call starts (the
        workers' start-up, a kill storm) would miss them all. ``family``: only keys of a
        family (whose jobs read their neighbours)."""
        first = generation(self.spec) + 3
        if what == "keys":
            # A cheap call asks for up to 24 keys (6 generations) from its own: further
            # ahead than that, no job has claimed the key yet.
            first += 4
            order = [g * KEYS_PER_GENERATION + offset for offset in (2, 1, 3, 0)
                     for g in range(first, first + 8)]
        else:
            order = list(range(first, first + 32))
        found = [i for i in order if i not in self.planted[what]
                 and (not family or has_family(i))][:count]
        self.planted[what].update(found)
        return found

    def _recent_graphs(self) -> list[int]:
        """Graphs jobs published a moment ago and keep loading (none of ours)."""
        top = generation(self.spec)
        return [i for i in range(max(0, top - 3), top) if i not in self.planted["graphs"]]

    # -- SQL

    def _execute(self, statements: list[tuple[str, list[Any]]]) -> None:
        if self.pg:
            import psycopg

            with psycopg.connect(libpq_url(self.spec["url"]), connect_timeout=5,
                                 application_name="soak-adversary") as conn:
                conn.execute("SET statement_timeout = '5s'")
                for sql, params in statements:
                    conn.execute(sql, params)
            return
        # Longer than a frozen worker holds the write lock (3 leases at most).
        db = sqlite3.connect(self.spec["url"].split("///", 1)[1], timeout=15,
                             isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=TRUNCATE")
            db.execute("BEGIN IMMEDIATE")
            for sql, params in statements:
                db.execute(sql, params)
            db.execute("COMMIT")
        finally:
            db.close()

    def _entry(self, number: int | None, key: Any = None,
               **columns: Any) -> tuple[str, list[Any]]:
        """A row of workload key ``number``, of ``key`` (a Key: a neighbour), or of a hash
        no job asks for; its hash is recorded as one the adversary tampered with."""
        now = time.time()
        if number is None and key is None:
            row: dict[str, Any] = {"key_hash": uuid.uuid4().hex * 2, "key_json": "{}",
                                   "kind": "gemm", "op": "mm", "device": "cpu",
                                   "torch_version": "2.13", "triton_version": None,
                                   "family": None}
        else:
            key = key or workload_key(self.spec["run"], number or 0)
            row = {"key_hash": key.hash, "key_json": key.json, **key.labels,
                   "family": key.family}
        row.update(state="claimed", owner="adversary", token=1, lease_expires_at=now,
                   attempts=1, timings_json=None, best=None, tune_seconds=None, error=None,
                   created_at=now, updated_at=now, last_used_at=None, hits=0, meta_json=None)
        row.update(columns)
        self.rows.append(row["key_hash"])
        return _upsert("tunecache_entries", _ENTRY_COLUMNS, "key_hash", row, self.pg)

    def _artifact(self, kind: str, key: str, size: int, payload: bytes,
                  **columns: Any) -> tuple[str, list[Any]]:
        digest = hashlib.sha256(payload).hexdigest()
        if self.blobs:
            self._write_blob(digest, payload)
        row = {"kind": kind, "cache_key": key, "digest": digest,
               "signature": self.rng.randbytes(64), "size": size, "torch_version": "soak",
               "created_at": time.time(), "last_used_at": time.time(),
               "payload": payload if self.pg else None, **columns}
        return _upsert("tunecache_artifacts", _ARTIFACT_COLUMNS, "kind, cache_key", row,
                       self.pg)

    def _lease_case(self, values: list[Any], **columns: Any) -> dict[str, Any]:
        numbers = self._upcoming(len(values))
        self._execute([self._entry(n, lease_expires_at=v, **columns)
                       for n, v in zip(numbers, values)])
        return {"keys": numbers, "variant": [repr(v) for v in values]}

    # -- claims no live owner holds

    def lease_far_future(self) -> dict[str, Any]:
        return self._lease_case([1e300, 253402300799.0])  # and 9999-12-31T23:59:59Z

    def lease_nan(self) -> dict[str, Any]:
        # SQLite stores a NaN bound from Python as NULL; PostgreSQL's float8 keeps it.
        return self._lease_case([float("nan")])

    def lease_negative(self) -> dict[str, Any]:
        return self._lease_case([-1.0, -1e300])

    def lease_wrong_type(self) -> dict[str, Any]:
        if self.pg:  # a typed column: the nearest to a wrong type are the infinities
            return self._lease_case([float("inf"), float("-inf")])
        # SQLite keeps text and bytes in a REAL column, and text in an INTEGER one.
        lease = self._lease_case(["next week", b"\x00\xff"])
        token = self._lease_case([time.time() + 3600.0], token="one")
        return {"keys": lease["keys"] + token["keys"],
                "variant": lease["variant"] + ["token 'one'"]}

    # -- rows that are not what a publisher wrote

    def garbled_timings(self) -> dict[str, Any]:
        texts = ['{"aten": 0.1,', '{"aten": "fast"}', "[1, 2]", "null", '{"aten": NaN}',
                 "\x1b[2J{}"]
        chosen = self.rng.sample(texts, 2)
        numbers = self._upcoming(2)
        self._execute([self._entry(n, state="done", lease_expires_at=None, timings_json=t,
                                   best="aten", tune_seconds=0.1, last_used_at=time.time())
                       for n, t in zip(numbers, chosen)])
        return {"keys": numbers, "variant": chosen}

    # -- neighbours: rows of the family of a key jobs will ask for next, read (through
    # TuneCache.neighbours) by the job that tunes it

    def _neighbours(self, rows: list[dict[str, Any]], variant: Any,
                    far: bool = False) -> dict[str, Any]:
        """Done rows (columns in ``rows``) of keys near (``far``: 6 octaves from) the
        next key of a family; that key is aimed at, not written."""
        (i,) = self._upcoming(1, family=True)
        now = time.time()
        self._execute([
            self._entry(None, neighbour_key(self.spec["run"], i, 129 + n,
                                            (i + 1) * 64 if far else None),
                        **{"state": "done", "lease_expires_at": None,
                           "timings_json": NEIGHBOUR_TIMINGS, "best": GEMM_CANDIDATES[1],
                           "tune_seconds": 0.1, "last_used_at": now, **columns})
            for n, columns in enumerate(rows)])
        return {"aimed": [i], "variant": variant}

    def huge_int_timings(self) -> dict[str, Any]:
        """A 310-digit integer timing: in a neighbour of the next key of a family, and in
        the own done row of another key jobs will ask for."""
        timings = raw_json({GEMM_CANDIDATES[0]: "@huge@", GEMM_CANDIDATES[1]: 0.25},
                           huge=HUGE_310)
        record = self._neighbours([{"timings_json": timings}], "310 digits")
        (j,) = self._upcoming(1)
        names = GEMM_CANDIDATES if has_family(j) else CANDIDATES
        own = raw_json({names[0]: "@huge@", names[1]: 0.25}, huge=HUGE_310)
        self._execute([self._entry(j, state="done", lease_expires_at=None, timings_json=own,
                                   best=names[1], tune_seconds=0.1, last_used_at=time.time())])
        return {**record, "keys": [j]}

    def huge_int_meta(self) -> dict[str, Any]:
        meta = raw_json({"baseline": {"candidate": GEMM_CANDIDATES[0], "ms": "@huge@"},
                         "best_ms": "@huge@"}, huge=HUGE_310)
        return self._neighbours([{"meta_json": meta}], "310 digits in baseline.ms, best_ms")

    def huge_transfer_benchmarked(self) -> dict[str, Any]:
        """Two rows whose transfer.benchmarked has 4300 digits: their sum has more than
        Python converts to text."""
        meta = raw_json({"transfer": {"from": [], "benchmarked": "@huge@", "generated": 3}},
                        huge="1" + "0" * 4299)
        return self._neighbours([{"meta_json": meta}, {"meta_json": meta}], "4300 digits")

    def nan_meta(self) -> dict[str, Any]:
        metas = [raw_json({"best_ms": "@nan@", "baseline": {"candidate": GEMM_CANDIDATES[0],
                                                           "ms": "@inf@"}},
                          nan="NaN", inf="Infinity"),
                 raw_json({"best_ms": "@inf@", "transfer": {"from": [], "benchmarked": "@nan@",
                                                            "generated": 3}},
                          nan="NaN", inf="-Infinity")]
        return self._neighbours([{"meta_json": m} for m in metas], "NaN, Infinity")

    def oversize_meta(self) -> dict[str, Any]:
        meta = json.dumps({"pad": "x" * OVERSIZE_BYTES})
        return self._neighbours([{"meta_json": meta}] * 2, f"{len(meta)} bytes")

    def oversize_timings(self) -> dict[str, Any]:
        timings = json.dumps({GEMM_CANDIDATES[0]: 0.5, GEMM_CANDIDATES[2]: "9" * OVERSIZE_BYTES})
        return self._neighbours([{"timings_json": timings}] * 2, f"{len(timings)} bytes")

    def hits_crowding(self) -> dict[str, Any]:
        """More rows than a key reads neighbours (64), far from it in size and used an
        enormous number of times, so that they come first: genuine neighbours are
        crowded out (slower tuning, never a wrong one)."""
        hits = 2**31 - 1 if self.pg else 2**62  # PostgreSQL's column is an int4
        return self._neighbours([{"hits": hits}] * 70, f"70 rows of {hits} hits", far=True)

    def family_escape(self) -> dict[str, Any]:
        """A done row whose family holds terminal escapes, CR and a newline."""
        (i,) = self._upcoming(1, family=True)
        family = "\x1b]0;owned\x07\x1b[2J\r\nfamily\x1b[0m"
        key = dataclasses.replace(neighbour_key(self.spec["run"], i), family=family)
        self._execute([self._entry(None, key, state="done", lease_expires_at=None,
                                   timings_json=NEIGHBOUR_TIMINGS, best=GEMM_CANDIDATES[1],
                                   tune_seconds=0.1, last_used_at=time.time())])
        return {"variant": repr(family)}

    def hostile_names(self) -> dict[str, Any]:
        old = self.rng.random() < 0.5  # old ones are what prune --older-than selects
        when = OLD if old else time.time()
        names: dict[str, Any] = {"kind": "gemm\r\x1b[2K", "op": "\x1b[31mmm\x1b[0m\x1b]0;owned\x07",
                 "device": "cpu\nFAKE LINE  done  aten", "torch_version": "2.13\x1b[5m",
                 "triton_version": "3.\u202e1"}
        if not self.pg:  # PostgreSQL refuses NUL and invalid UTF-8 in text
            names.update(torch_version="2.13\x00evil", triton_version=RawText(b"3.\xed\xa0\x80"))
        key_json = json.dumps({"kind": "gemm", "op": "\x1b[31mmm\nx"}) + "\x1b[0m"
        statements = [self._entry(None, state="done", lease_expires_at=None, key_json=key_json,
                                  timings_json='{"aten": 0.5}', best="aten\x1b[1m",
                                  tune_seconds=0.5, created_at=when, updated_at=when,
                                  last_used_at=when, **names)]
        key = "\x1b[2Jgraph\nkey\x07" + ("\x00nul" if not self.pg else "") + uuid.uuid4().hex
        payload = self.rng.randbytes(100)
        statements.append(self._artifact("fxgraph", key, len(payload), payload,
                                         torch_version="2.13\x1b[5m\n", created_at=when,
                                         last_used_at=when))
        self._execute(statements)
        return {"variant": "old" if old else "new"}

    def _graph_size(self, size: int) -> dict[str, Any]:
        (i,) = self._upcoming(1, "graphs")
        kind, key = graph_key(self.spec["run"], i)
        self._execute([self._artifact(kind, key, size, self.rng.randbytes(512))])
        return {"graphs": [i], "variant": size}

    def graph_size_2gib(self) -> dict[str, Any]:
        return self._graph_size(2 * 2**30)

    def graph_size_negative(self) -> dict[str, Any]:
        return self._graph_size(-10**18)

    def graph_size_int64_max(self) -> dict[str, Any]:
        return self._graph_size(2**63 - 1)

    # -- key files

    def verify_key_world_writable(self) -> dict[str, Any]:
        keys = self.spec["keys"]
        with open(keys["verify"], "rb") as f:
            data = f.read()
        tmp = f"{keys['hostile_verify']}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666)  # whatever the umask: writable by every user
        os.replace(tmp, keys["hostile_verify"])
        return {"variant": oct(os.stat(keys["hostile_verify"]).st_mode & 0o777)}

    # -- blob files (SQLite)

    def _real_dir(self, path: str) -> bool:
        """Make ``path`` a real directory under the blob root, unless a symlink (one of
        ours) is in the way: the adversary never creates anything through one."""
        walk = self.blobs
        for part in [".", *os.path.relpath(path, self.blobs).split(os.sep)]:
            walk = os.path.normpath(os.path.join(walk, part))
            if os.path.islink(walk):
                return False
            os.makedirs(walk, exist_ok=True)
        return True

    def _write_blob(self, digest: str, payload: bytes) -> None:
        shard = os.path.join(self.blobs, digest[:2])
        if self._real_dir(shard):
            path = os.path.join(shard, digest)
            with open(f"{path}.adv", "wb") as f:
                f.write(payload)
            os.replace(f"{path}.adv", path)

    def _canary_file(self, folder: str, name: str, content: bytes, mode: int) -> dict[str, Any]:
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(content)
        os.chmod(path, mode)
        os.utime(path, (OLD, OLD))
        return {"path": path, "sha256": hashlib.sha256(content).hexdigest(), "mode": mode}

    def _canary_dir(self, prefix: str, lock_names: bool) -> tuple[str, list[dict[str, Any]]]:
        """A directory outside the cache holding old files named like what a prune
        removes from a shard (orphan blobs, leftovers of writers, stale locks)."""
        self.made += 1
        folder = os.path.join(self.spec["canary"], f"dir-{self.made}")
        os.makedirs(folder)
        def fake() -> str:
            return prefix + uuid.uuid4().hex + uuid.uuid4().hex[:30]

        names = ([f"{fake()}.lock", f"{fake()}.lock"] if lock_names
                 else [fake(), f"{fake()}.lock", f"{fake()}.tmp.1.deadbeef"])
        files = [self._canary_file(folder, n, f"canary {n}\n".encode(), 0o644)
                 for n in [*names, "precious.txt"]]
        os.utime(folder, (OLD, OLD))
        return folder, files

    def _symlink_shard(self, parent: str, prefix: str, lock_names: bool) -> dict[str, Any]:
        shard = os.path.join(parent, prefix)
        if not self._real_dir(parent) or os.path.islink(shard):
            return {"skipped": "shard already a symlink"}
        folder, files = self._canary_dir(prefix, lock_names)
        if os.path.isdir(shard):  # out of the cache, as an adversary may
            self.made += 1
            os.rename(shard, os.path.join(self.spec["trash"], f"shard-{self.made}"))
        tmp = os.path.join(parent, f".adv-{uuid.uuid4().hex}")
        os.symlink(folder, tmp)
        os.replace(tmp, shard)
        return {"canary": files, "canary_dirs": [folder], "variant": shard}

    def blob_shard_symlink(self) -> dict[str, Any]:
        (i,) = self._upcoming(1, "graphs")
        digest = graph_digest(self.spec["run"], i)
        return {"graphs": [i], **self._symlink_shard(self.blobs, digest[:2], False)}

    def keys_shard_symlink(self) -> dict[str, Any]:
        (i,) = self._upcoming(1, "graphs")
        kind, key = graph_key(self.spec["run"], i)
        name = hashlib.sha256(f"{kind}\0{key}".encode()).hexdigest()
        return {"graphs": [i],
                **self._symlink_shard(os.path.join(self.blobs, "keys"), name[:2], True)}

    def lock_symlink(self) -> dict[str, Any]:
        (i,) = self._upcoming(1, "graphs")
        kind, key = graph_key(self.spec["run"], i)
        digest = graph_digest(self.spec["run"], i)
        name = hashlib.sha256(f"{kind}\0{key}".encode()).hexdigest()
        self.made += 1
        folder = os.path.join(self.spec["canary"], f"locks-{self.made}")
        os.makedirs(folder)
        files, planted = [], []
        for n, lock in enumerate([os.path.join(self.blobs, digest[:2], f"{digest}.lock"),
                                  os.path.join(self.blobs, "keys", name[:2], f"{name}.lock")]):
            if not self._real_dir(os.path.dirname(lock)):
                continue
            target = self._canary_file(folder, f"target-{n}", b"canary lock target\n", 0o640)
            tmp = f"{lock}.adv"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.symlink(target["path"], tmp)
            os.replace(tmp, lock)
            files.append(target)
            planted.append(lock)
        return {"graphs": [i], "canary": files, "canary_dirs": [folder], "variant": planted}

    def blob_fifo(self) -> dict[str, Any]:
        """Replace the blobs of the two latest graphs jobs are loading now with FIFOs no
        one writes."""
        from tunecache.store.blobs import DIGEST

        done: dict[str, Any] = {"graphs": [], "variant": []}
        for i in reversed(self._recent_graphs()):
            kind, key = graph_key(self.spec["run"], i)
            conn = sqlite3.connect(self.spec["url"].split("///", 1)[1], timeout=5)
            try:
                row = conn.execute("SELECT digest FROM tunecache_artifacts WHERE kind = ? "
                                   "AND cache_key = ?", (kind, key)).fetchone()
            finally:
                conn.close()
            if row is None or not isinstance(row[0], str) or not DIGEST.match(row[0]):
                continue
            shard = os.path.join(self.blobs, row[0][:2])
            if os.path.islink(shard) or not os.path.isdir(shard):
                continue
            tmp = os.path.join(shard, f".adv-fifo-{uuid.uuid4().hex}")
            os.mkfifo(tmp)
            os.replace(tmp, os.path.join(shard, row[0]))
            done["graphs"].append(i)
            done["variant"].append(row[0][:12])
            if len(done["graphs"]) == 2:
                break
        return done if done["graphs"] else {"skipped": "no published graph in the window yet"}


def run_adversary(spec: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Adversary(spec).run()


# -- the operator: tunecache's CLI while jobs run ----------------------------------------------

# Placeholders in a command: the hash of a row the adversary planted (a different case
# each time), and the operator's export file.
PLANTED, EXPORT = "{planted}", "{export}"
OPERATOR_COMMANDS = [
    ("cli_stats", ["stats"]),
    ("cli_ls", ["ls"]),
    ("cli_prune", ["prune", "--max-graph-bytes", "256KiB", "--older-than", "30d"]),
    ("cli_ls", ["ls", "--graphs"]),
    ("cli_stats", ["stats", "--json"]),
    ("cli_ls", ["ls", "--json", "--limit", "200"]),
    ("cli_prune", ["prune", "--max-graph-bytes", "64KiB", "--older-than", "7d", "--dry-run"]),
    ("cli_ls", ["ls", "--graphs", "--json"]),
    ("cli_show", ["show", PLANTED]),
    ("cli_export", ["export", "-o", EXPORT]),
    ("cli_prune", ["prune", "--invalid", "--dry-run"]),
    ("cli_export", ["export", "--best-only", "-o", EXPORT]),
]
# The last round, once every worker has stopped: each symlink planted is seen by a prune.
FINAL_COMMANDS = [
    ("cli_prune", ["prune", "--max-graph-bytes", "256KiB", "--older-than", "30d"]),
    ("cli_ls", ["ls", "--graphs"]),
    ("cli_stats", ["stats"]),
    ("cli_stats", ["stats", "--json"]),
    ("cli_show", ["show", PLANTED]),
    ("cli_prune", ["prune", "--invalid", "--dry-run"]),
    ("cli_export", ["export", "-o", EXPORT]),
    ("cli_export", ["export", "--best-only", "-o", EXPORT]),
]
# What a terminal would act on: C0 controls but tab and newline, DEL and C1 controls.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> bool:
    """Whether ``text`` is one JSON value, or JSON lines, as any parser reads them: no
    NaN or Infinity tokens."""
    try:
        json.loads(text, parse_constant=_not_json)
        return True
    except ValueError:
        pass
    try:
        for line in text.splitlines():
            if line.strip():
                json.loads(line, parse_constant=_not_json)
    except ValueError:
        return False
    return True


def judge_cli(args: list[str], rc: int, out: bytes, err: bytes) -> tuple[str, str]:
    """("ok" | "error" | "failed", why) of one operator command: exit 0 with clean
    output, or 1/2 with a one-line error, and never a traceback."""
    try:
        text, errors = out.decode(), err.decode()
    except UnicodeDecodeError:
        return "failed", "output is not UTF-8"
    if "Traceback (most recent call last)" in errors:
        return "failed", "traceback: " + errors.strip().splitlines()[-1][:200]
    bad = _CONTROL.search(text + errors)
    if bad:
        return "failed", f"raw control character {bad.group()!r} in the output"
    if rc == 0:
        if "--json" in args and not strict_json(text):
            return "failed", "--json output is not strict JSON"
        if args[0] == "export":
            with open(args[args.index("-o") + 1], "rb") as f:
                try:
                    written = f.read().decode()
                except UnicodeDecodeError:
                    return "failed", "the export file is not UTF-8"
            if _CONTROL.search(written) or not strict_json(written):
                return "failed", "the export file is not strict JSON lines"
        return "ok", ""
    lines = [line for line in errors.splitlines() if line.strip()]
    if rc in (1, 2) and len(lines) == 1:
        return "error", lines[0][:200]
    return "failed", f"exit status {rc} with {len(lines)} lines on stderr"


class Operator(threading.Thread):
    """Runs `tunecache stats`, `ls` and `prune` now and then, as an operator would, each
    as a subprocess in a session of its own under CLI_TIMEOUT (past it, its process group
    is killed and it counts as hung). The environment is the operator's: none of the
    workers' TUNECACHE_* settings."""

    def __init__(self, url: str, deadline: float, logdir: str) -> None:
        super().__init__(name="soak-operator", daemon=True)
        self.url, self.deadline, self.logdir = url, deadline, logdir
        self.shown = 0  # show: the planted row of which case comes next
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECACHE_")}
        self.runs: list[dict[str, Any]] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def run(self) -> None:
        n = 0
        while not self._halt.wait(OPERATOR_EVERY) and time.time() < self.deadline:
            self.command(*OPERATOR_COMMANDS[n % len(OPERATOR_COMMANDS)])
            n += 1

    def planted(self) -> str | None:
        """The hash of a row the adversary wrote, of the next case by turns."""
        last: dict[str, str] = {}
        for plant in read_plants(self.logdir):
            if plant.get("rows"):
                last[plant["case"]] = plant["rows"][-1]
        if not last:
            return None
        self.shown += 1
        return last[sorted(last)[self.shown % len(last)]]

    def command(self, case: str, args: list[str], final: bool = False) -> None:
        planted = self.planted() if PLANTED in args else None
        if PLANTED in args and planted is None:
            return  # nothing planted yet
        export = os.path.join(self.logdir, "export.jsonl")
        args = [(planted or a) if a == PLANTED else export if a == EXPORT else a for a in args]
        argv = [sys.executable, "-m", "tunecache.cli", *args, "--db", self.url]
        start = time.time()
        with self._lock:
            if self._halt.is_set() and not final:
                return  # stopped meanwhile
            proc = self._proc = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=CLI_TIMEOUT)
            outcome, why = judge_cli(args, proc.returncode, out, err)
            if final and outcome == "error":
                # The last round runs on a quiet database (no chaos, no outage): an error
                # there is the command's own, e.g. a hostile row it cannot get past.
                outcome, why = "failed", f"error with no chaos: {why}"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            outcome, why = "hang", f"still running after {CLI_TIMEOUT:g}s"
        finally:
            with self._lock:
                self._proc = None
        self.runs.append({"case": case, "args": args, "rc": proc.returncode,
                          "start": start, "seconds": round(time.time() - start, 2),
                          "outcome": outcome, "why": why})

    def stop(self, kill: bool) -> None:
        """Start no more commands; ``kill``: kill the one under way (an interrupted soak
        leaves none behind), else let it end (CLI_TIMEOUT bounds it)."""
        self._halt.set()
        if kill:
            with self._lock:
                if self._proc is not None:
                    _kill_group(self._proc)
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=30 if kill else CLI_TIMEOUT + 30)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child started in a session of its own, with whatever it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGCONT)
        os.killpg(proc.pid, signal.SIGKILL)


# -- the chaos driver ----------------------------------------------------------------------


@dataclasses.dataclass
class Options:
    seconds: float
    workers: int
    lease: float
    seed: int
    restart_every: float
    hostile: bool = True  # the adversary, the operator and compiled graphs
    max_attempts: int = 10

    @property
    def hang_bound(self) -> float:
        return HANG_LEASES * self.lease


@dataclasses.dataclass
class Chaos:
    """What the driver did, with times (epoch seconds), per pid."""

    died: dict[int, float] = dataclasses.field(default_factory=dict)  # killed or crashed
    kills: int = 0
    storms: int = 0
    freezes: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)
    long_freezes: int = 0
    restarts: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    terminated: int = 0
    crashes: list[str] = dataclasses.field(default_factory=list)
    hung: int = 0
    # Operations the watchdog ended: {pid, op, what it was doing, waited}.
    hangs: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class Driver:
    """Keeps ``workers`` worker processes running until the deadline and hurts them."""

    def __init__(self, opts: Options, url: str, logdir: str, env: dict[str, str],
                 restart_cmd: Any, hostile: dict[str, Any] | None = None) -> None:
        self.opts, self.url, self.logdir, self.env = opts, url, logdir, env
        self.restart_cmd = restart_cmd  # callable(mode) -> argv, or None: no restarts
        self.rng = random.Random(opts.seed)
        self.chaos = Chaos()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.frozen: dict[int, tuple[float, float]] = {}  # pid -> (since, thaw at)
        self.thawed_at: dict[int, float] = {}
        self.restarting: tuple[subprocess.Popen[bytes], float] | None = None
        self.spawned = 0
        self.t0 = time.time()
        self.deadline = self.t0 + opts.seconds
        # hostile: the key files, the canary and trash folders, the blob root (SQLite).
        self.spec = {"url": url, "logdir": logdir, "run": uuid.uuid4().hex[:12],
                     "seed": opts.seed, "t0": self.t0, "deadline": self.deadline,
                     **(hostile or {})}
        self.adversary: subprocess.Popen[bytes] | None = None
        self.operator = Operator(url, self.deadline, logdir) if hostile else None
        self._next_watch = 0.0

    def spawn(self, role: str = "worker") -> subprocess.Popen[bytes]:
        self.spawned += 1
        with open(os.path.join(self.logdir, f"{role}-{self.spawned}.log"), "wb") as out:
            return subprocess.Popen(
                [sys.executable, __file__, f"--{role}", json.dumps(self.spec)],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def run(self) -> None:
        if self.operator is not None:
            self.adversary = self.spawn("adversary")
            self.operator.start()
        self.procs = [self.spawn() for _ in range(self.opts.workers)]
        next_event = time.time() + 2.0
        next_restart = time.time() + self.opts.restart_every
        while time.time() < self.deadline:
            self._reap()
            self._watch()
            self._thaw(due_only=True)
            self._restart_progress()
            now = time.time()
            if now >= next_event:
                self._random_event()
                next_event = now + self.rng.uniform(0.5, 1.5)
            if self.restart_cmd and now >= next_restart and self.restarting is None:
                self._start_restart()
                next_restart = now + self.opts.restart_every
            time.sleep(0.05)
        self._thaw(due_only=False)
        self._finish()
        if self.operator is not None:
            self.operator.stop(kill=False)
            self._stop_adversary()
            for case, args in FINAL_COMMANDS:
                self.operator.command(case, args, final=True)

    def _stop_adversary(self) -> None:
        """The adversary plants nothing after the deadline; one stuck past a plant's
        timeouts is killed."""
        if self.adversary is None:
            return
        try:
            self.adversary.wait(timeout=HOSTILE_EVERY + 30)
        except subprocess.TimeoutExpired:
            _kill_group(self.adversary)
            self.adversary.wait()

    # Events ---------------------------------------------------------------------------

    def _random_event(self) -> None:
        roll, live = self.rng.random(), self._live()
        if roll < 0.35:
            self._kill(self.rng.sample(live, min(1, len(live))))
        elif roll < 0.40:
            self._kill(self.rng.sample(live, len(live) // 2))
            self.chaos.storms += 1
        elif roll < 0.80:
            self._freeze_crowd()
        elif self.url.startswith("postgresql") and self.restarting is None:
            try:
                self.chaos.terminated += terminate_backends(self.url, self.rng)
            except Exception:  # noqa: BLE001 - the server may be down: skip this one
                pass

    def _live(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def _kill(self, victims: list[subprocess.Popen[bytes]]) -> None:
        for p in victims:
            _kill_group(p)
            p.wait()
            self.chaos.died[p.pid] = time.time()
            self.chaos.kills += 1
            if p.pid in self.frozen:
                since, _ = self.frozen.pop(p.pid)
                self.chaos.freezes.append((p.pid, since, time.time()))

    def _freeze_crowd(self) -> None:
        now = time.time()
        lease = self.opts.lease
        # A pid thawed less than a lease ago is left alone: two short freezes back to back
        # would cost its lease as one long one would.
        ready = [p for p in self._live() if p.pid not in self.frozen
                 and now - self.thawed_at.get(p.pid, 0.0) > lease]
        if not ready:
            return
        crowd = self.rng.sample(ready, self.rng.randint(1, max(1, len(ready) // 2)))
        long = self.rng.random() < 0.5
        seconds = self.rng.uniform(1.5, 3.0) * lease if long else self.rng.uniform(0.1, 0.3) * lease
        self.chaos.long_freezes += long
        for p in crowd:
            os.kill(p.pid, signal.SIGSTOP)
            self.frozen[p.pid] = (time.time(), now + seconds)

    def _thaw(self, due_only: bool) -> None:
        now = time.time()
        for pid, (since, until) in list(self.frozen.items()):
            if due_only and now < until:
                continue
            os.kill(pid, signal.SIGCONT)
            self.chaos.freezes.append((pid, since, time.time()))
            self.thawed_at[pid] = time.time()
            del self.frozen[pid]

    def _start_restart(self) -> None:
        mode = "immediate" if len(self.chaos.restarts) % 2 else "fast"
        proc = subprocess.Popen(self.restart_cmd(mode), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        self.restarting = (proc, time.time())

    def _restart_progress(self) -> None:
        if self.restarting is not None and self.restarting[0].poll() is not None:
            self.chaos.restarts.append((self.restarting[1], time.time()))
            self.restarting = None

    def _reap(self) -> None:
        """Replace killed workers; one that exited before the deadline crashed."""
        for n, p in enumerate(self.procs):
            if p.poll() is None:
                continue
            if p.returncode != 0 and p.pid not in self.chaos.died:
                self.chaos.crashes.append(f"worker {p.pid} exited with {p.returncode}")
                self.chaos.died[p.pid] = time.time()  # its claims may be taken over
            if time.time() < self.deadline:
                self.procs[n] = self.spawn()

    def _watch(self) -> None:
        """The watchdog, twice a second: a worker whose operation has waited longer than
        the hang bound (its own tuning and the time it was frozen not counted) hangs; it
        is killed with its process group, recorded, and replaced like a killed worker."""
        now = time.time()
        if now < self._next_watch:
            return
        self._next_watch = now + 0.5
        for p in self._live():
            status = read_status(self.logdir, p.pid)
            if not status:
                continue
            try:
                since = status.get("tune_since")
                tuning = float(status["tuned"]) + (now - float(since) if since else 0.0)
                waited = now - float(status["start"]) - tuning \
                    - self._frozen_for(p.pid, float(status["start"]), now)
            except (KeyError, TypeError, ValueError):
                continue
            if waited > self.opts.hang_bound:
                _kill_group(p)
                p.wait()
                self.chaos.died[p.pid] = time.time()  # its claims may be taken over
                if p.pid in self.frozen:
                    since_frozen, _ = self.frozen.pop(p.pid)
                    self.chaos.freezes.append((p.pid, since_frozen, time.time()))
                self.chaos.hangs.append({**status, "pid": p.pid, "waited": round(waited, 1),
                                         "at": round(now - self.t0, 1)})

    def _frozen_for(self, pid: int, start: float, end: float) -> float:
        windows = [(a, b) for q, a, b in self.chaos.freezes if q == pid]
        if pid in self.frozen:
            windows.append((self.frozen[pid][0], end))
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in windows)

    def _finish(self) -> None:
        """Let the last calls end (bounded by the worst case of a wait: no progress for
        the wait timeout, then a lock timeout), the watchdog still on, then kill
        whatever is left."""
        self._end_restart()
        bound = time.time() + float(self.env["TUNECACHE_WAIT_TIMEOUT"]) \
            + 2 * float(self.env["TUNECACHE_LOCK_TIMEOUT"]) + 60
        while self._live() and time.time() < bound:
            self._watch()
            time.sleep(0.1)
        for p in self._live():
            self.chaos.hung += 1
            _kill_group(p)
            p.wait()
            self.chaos.died[p.pid] = time.time()
        for p in self.procs:
            if p.returncode not in (None, 0) and p.pid not in self.chaos.died:
                self.chaos.crashes.append(f"worker {p.pid} exited with {p.returncode}")

    def cleanup(self) -> None:
        """On any exit: no worker, adversary or operator command left stopped or
        running, no restart left behind."""
        if self.operator is not None:
            self.operator.stop(kill=True)
        for p in [*self.procs, *([self.adversary] if self.adversary else [])]:
            if p.poll() is None:
                _kill_group(p)
                p.wait()
        self._end_restart()

    def _end_restart(self) -> None:
        """Wait for a restart under way (pg_ctl -w gives up after 60 s), then record it."""
        if self.restarting is not None:
            try:
                self.restarting[0].wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.restarting[0].kill()
                self.restarting[0].wait()
            self._restart_progress()


# -- what happened ---------------------------------------------------------------------------


def read_events(logdir: str) -> Iterator[dict[str, Any]]:
    for path in sorted(glob.glob(os.path.join(logdir, "events-*.jsonl"))):
        with open(path) as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue  # cannot happen with one write per line; never fatal


def _overlaps(windows: list[tuple[float, float]], start: float, end: float,
              at_least: float) -> bool:
    return any(a < end and b > start and b - a >= at_least for a, b in windows)


def analyse(driver: Driver, outages: list[tuple[float, float]]) -> dict[str, Any]:
    lease, chaos = driver.opts.lease, driver.chaos
    tunes: dict[tuple[int, int], list[dict[str, Any]]] = {}  # (pid, call) -> tune events
    calls: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []  # graph loads and publishes, key files
    jobs: dict[tuple[int, int], dict[str, Any]] = {}  # (pid, job) -> its end, if it ended
    plans: list[bool] = []  # per tune of a key of a family: whether transfer planned
    plants = read_plants(driver.logdir)
    # Keys the adversary wrote rows for are judged by the hostile cases, not by the
    # duplicate and divergence checks (their stored rows are the adversary's).
    hostile = {i for p in plants for i in p.get("keys", [])}
    for ev in read_events(driver.logdir):
        if ev["ev"] == "tune":
            if ev["i"] not in hostile:
                tunes.setdefault((ev["pid"], ev["call"]), []).append(ev)
        elif ev["ev"] == "call":
            calls.append(ev)
            jobs.setdefault((ev["pid"], ev["job"]), {})
        elif ev["ev"] == "job":
            jobs[(ev["pid"], ev["job"])] = ev
        elif ev["ev"] == "plan":
            plans.append(ev["planned"])
        else:
            others.append(ev)
    # A tune is local if the cache was already disabled when it started, or if it is the
    # last tune of a key in a call whose result for that key was local (a wait timeout).
    for call in calls:
        for i, (source, _) in call["results"].items():
            if source == "local":
                mine = [t for t in tunes.get((call["pid"], call["call"]), []) if t["i"] == int(i)]
                if mine:
                    mine[-1]["local"] = True
    claimed: dict[int, list[tuple[float, int, int]]] = {}
    local_tunes = 0
    for events in tunes.values():
        for t in events:
            if t["local"]:
                local_tunes += 1
            else:
                claimed.setdefault(t["i"], []).append((t["t"], t["pid"], t["call"]))

    freezes_by_pid: dict[int, list[tuple[float, float]]] = {}
    for pid, a, b in chaos.freezes:
        freezes_by_pid.setdefault(pid, []).append((a, b))
    down = outages + chaos.restarts

    def excused(pid: int, start: float, end: float) -> bool:
        return (chaos.died.get(pid, float("inf")) <= end
                or _overlaps(freezes_by_pid.get(pid, []), start, end, lease / 2)
                or _overlaps(down, start, end, lease / 2))

    # A tuner that raised gave its claim back (the call raised, counted as failed): the
    # next tune of its key is no duplicate.
    raised_calls = {(c["pid"], c["call"]) for c in calls if c["raised"]}
    duplicates = []
    for i, starts in claimed.items():
        starts.sort()
        for (t1, p1, c1), (t2, p2, _) in itertools.pairwise(starts):
            if (p1, c1) not in raised_calls and not excused(p1, t1, t2):
                duplicates.append(f"key {i}: pid {p1} at {t1 - driver.t0:.1f}s, "
                                  f"pid {p2} at {t2 - driver.t0:.1f}s")

    numbers = ({int(i) for c in calls for i in c["results"]} | set(claimed)) - hostile
    asked = {workload_key(driver.spec["run"], i).hash: i
             for i in {int(i) for c in calls for i in c["keys"]} | set(claimed)}
    stored, takeovers = read_stored(driver.url, driver.spec["run"], numbers)
    divergent: dict[int, str] = {}
    sources: dict[str, int] = {}
    longest = 0.0
    for call in calls:
        own_freeze = sum(min(b, call["end"]) - max(a, call["start"])
                         for a, b in freezes_by_pid.get(call["pid"], [])
                         if a < call["end"] and b > call["start"])
        longest = max(longest, call["end"] - call["start"] - own_freeze)
        for i, (source, timings) in call["results"].items():
            sources[source] = sources.get(source, 0) + 1
            if int(i) in hostile:
                continue
            if source in ("hit", "tuned", "peer") and timings != stored.get(int(i)):
                divergent.setdefault(int(i), f"key {i}: pid {call['pid']} got {source} "
                                     f"{timings}, stored {stored.get(int(i))}")
    raised = [f"pid {c['pid']}: {c['raised']}" for c in calls if c["raised"]]
    return {
        "keys": len(numbers),
        "calls": len(calls),
        "tunes_claimed": sum(map(len, claimed.values())),
        "tunes_local": local_tunes,
        "kills": chaos.kills,
        "storms": chaos.storms,
        "freezes": len(chaos.freezes),
        "long_freezes": chaos.long_freezes,
        "pg_restarts": len(chaos.restarts),
        "backends_terminated": chaos.terminated,
        "outages": len(outages),
        "takeovers": takeovers,
        "duplicates_by_live_owners": len(duplicates),
        "divergent": len(divergent),
        "raised": len(raised),
        "failed": sources.get("failed", 0),
        "local_results": sources.get("local", 0),
        "crashes": len(chaos.crashes),
        "hung": chaos.hung,
        "longest_wait_s": round(longest, 2),
        "sources": sources,
        "examples": (duplicates[:3] + list(divergent.values())[:3] + raised[:3]
                     + chaos.crashes[:3]),
        # Calls that raised are counted by hostile_report, by case.
        "jobs": len(jobs),
        "tunes_planned": f"{sum(plans)}/{len(plans)}",
        "peak_rss_mib": round(max((j.get("rss_kib", 0) for j in jobs.values()), default=0)
                              / 1024, 1),
        **hostile_report(driver, calls, others, plants, freezes_by_pid,
                         duplicates + list(divergent.values()) + chaos.crashes,
                         read_failed(driver.url), asked),
    }


def read_plants(logdir: str) -> list[dict[str, Any]]:
    path = os.path.join(logdir, "plants.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_canaries(plants: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(case, what happened) for every canary file outside the cache that is gone, no
    longer a plain file, or changed in content or mode, and every file that appeared in
    a canary folder: the files outside the cache that the soak touched."""
    touched: list[tuple[str, str]] = []
    for plant in plants:
        known = set()
        for c in plant.get("canary", []):
            known.add(c["path"])
            try:
                st = os.lstat(c["path"])
                if not os.path.isfile(c["path"]) or os.path.islink(c["path"]):
                    why = "is no longer a plain file"
                else:
                    with open(c["path"], "rb") as f:
                        same = hashlib.sha256(f.read()).hexdigest() == c["sha256"]
                    why = ("content changed" if not same
                           else f"mode {st.st_mode & 0o7777:o}, was {c['mode']:o}"
                           if st.st_mode & 0o7777 != c["mode"] else "")
            except FileNotFoundError:
                why = "deleted"
            if why:
                touched.append((plant["case"], f"{c['path']}: {why}"))
        for folder in plant.get("canary_dirs", []):
            try:
                names = os.listdir(folder)
            except OSError:
                touched.append((plant["case"], f"{folder}: folder gone"))
                continue
            for name in names:
                if os.path.join(folder, name) not in known:
                    touched.append((plant["case"], f"{folder}/{name}: created there"))
    return touched


def hostile_report(driver: Driver, calls: list[dict[str, Any]], others: list[dict[str, Any]],
                   plants: list[dict[str, Any]],
                   freezes_by_pid: dict[int, list[tuple[float, float]]],
                   normal_failures: list[str], failed_keys: list[tuple[str, str]],
                   numbers_by_hash: dict[str, int]) -> dict[str, Any]:
    """Per hostile case: plants, failures, hangs and keys marked failed, attributed by
    the keys and graphs the adversary aimed at; and the invariants. A call that asked
    for keys of several cases counts under each of them (the invariants count it
    once). ``failed_keys``: (hash, error) of every entry in state failed."""
    bound = driver.opts.hang_bound
    cases: dict[str, dict[str, Any]] = {}
    totals = {"failed": 0, "hung": 0, "cli": 0, "failed_key": 0}
    failed_jobs: set[tuple[int, int]] = set()

    def case(name: str) -> dict[str, Any]:
        return cases.setdefault(name, {"planted": 0, "skipped": 0, "failed": 0, "hung": 0,
                                       "keys_failed": 0, "examples": []})

    # The column of a case each total counts in.
    column = {"failed": "failed", "cli": "failed", "hung": "hung", "failed_key": "keys_failed"}

    def count(names: list[str] | str, what: str, example: str, ev: Any = None) -> None:
        """One ``what`` (a key of totals) of cases ``names``. Failures of a job's events
        count the job once (jobs failed); other failures (duplicates, divergent results,
        crashes) count each."""
        if what == "failed" and ev is not None and "job" in ev:
            job = (ev["pid"], ev["job"])
            totals[what] += job not in failed_jobs
            failed_jobs.add(job)
        else:
            totals[what] += 1
        names = [names] if isinstance(names, str) else names
        for name in names:
            c = case(name)
            c[column[what]] += 1
            if len(c["examples"]) < 3:
                also = f" [also counted under {', '.join(n for n in names if n != name)}]" \
                    if len(names) > 1 else ""
                c["examples"].append(example[:300] + also)

    key_case: dict[int, str] = {}
    graph_case: dict[int, str] = {}
    for p in plants:
        c = case(p["case"])
        c["skipped" if "skipped" in p else "planted"] += 1
        key_case.update({i: p["case"] for i in [*p.get("keys", []), *p.get("aimed", [])]})
        graph_case.update({i: p["case"] for i in p.get("graphs", [])})

    def attribute(keys: Any = (), graph: Any = None, role: Any = None) -> list[str]:
        names = list(dict.fromkeys(key_case[i] for i in keys or () if i in key_case))
        if graph in graph_case:
            names.append(graph_case[graph])
        if role == "hostile_key":
            names.append("verify_key_world_writable")
        return names or ["normal"]

    def frozen(pid: int, start: float, end: float) -> float:
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in freezes_by_pid.get(pid, []))

    for example in normal_failures:
        count("normal", "failed", example)
    for call in calls:
        names = attribute(call.get("keys"))
        if call["raised"]:
            count(names, "failed", f"pid {call['pid']} raised {call['raised']}", call)
        waited = call["end"] - call["start"] - call.get("tuning", 0.0) \
            - frozen(call["pid"], call["start"], call["end"])
        if waited > bound:
            count(names, "hung", f"pid {call['pid']} waited {waited:.1f}s on keys "
                  f"{call.get('keys')}")
    for ev in others:
        names = attribute(graph=ev.get("graph"), role=ev.get("role"))
        if ev.get("raised"):
            count(names, "failed", f"pid {ev['pid']} {ev['ev']} raised {ev['raised']}", ev)
        if ev.get("wrong"):
            count(names, "failed", f"pid {ev['pid']} loaded graph {ev['graph']} with other "
                  "bytes than were published", ev)
        if ev["ev"] == "keyfile" and ev["role"] == "hostile_key" and ev["accepted"]:
            count(names, "failed", f"pid {ev['pid']} loaded the world-writable verify key", ev)
        waited = ev["end"] - ev["start"] - frozen(ev["pid"], ev["start"], ev["end"])
        if waited > bound:
            count(names, "hung", f"pid {ev['pid']} {ev['ev']} took {waited:.1f}s")
    for h in driver.chaos.hangs:
        count(attribute(h.get("keys"), h.get("graph"), h.get("role")), "hung",
              f"pid {h['pid']} killed after waiting {h['waited']}s in {h['op']} "
              f"({', '.join(f'{k} {h[k]}' for k in ('keys', 'graph', 'role') if k in h)})")
    for _ in range(driver.chaos.hung):
        count("normal", "hung", "a worker still running past the final bound")
    for run in driver.operator.runs if driver.operator else []:
        c = case(run["case"])
        c["planted"] += 1
        if run["outcome"] == "error":  # allowed (exit 1 or 2, one line), but worth seeing
            c["errors"] = c.get("errors", 0) + 1
            if len(c["examples"]) < 3:
                c["examples"].append(f"(error) tunecache {' '.join(run['args'])}: {run['why']}")
        if run["outcome"] in ("failed", "hang"):
            count(run["case"], "cli" if run["outcome"] == "failed" else "hung",
                  f"tunecache {' '.join(run['args'])}: {run['why']}")
    # Keys marked failed: each must be one the adversary wrote a row for; any other was
    # charged for someone else's row (a neighbour), or failed on its own.
    tampered = {h for p in plants for h in p.get("rows", [])}
    untampered = []
    for row_hash, error in failed_keys:
        if row_hash in tampered:
            continue
        i = numbers_by_hash.get(row_hash)
        untampered.append(row_hash)
        count(attribute([i] if i is not None else ()), "failed_key",
              f"key {row_hash[:16]} (number {i}) marked failed: {error}")
    touched = check_canaries(plants)
    for planted_by, what in touched:
        c = case(planted_by)
        c["touched"] = c.get("touched", 0) + 1
        if len(c["examples"]) < 3:
            c["examples"].append(what)
    return {
        "cases": cases,
        "jobs_failed": totals["failed"],
        "keys_failed_untampered": totals["failed_key"],
        "keys_failed": len(failed_keys),
        "cli_failed": totals["cli"],
        "files_touched": len(touched),
        "hangs": totals["hung"],
        "hang_bound_s": bound,
    }


def read_stored(url: str, run: str, numbers: set[int]) -> tuple[dict[int, Any], int]:
    """Stored timings of done keys by number, and the takeovers (every claim after a
    key's first bumps its fencing token), read through tunecache's own store."""
    hashes = {workload_key(run, i).hash: i for i in numbers}
    cache = tunecache.open(url)
    try:
        rows = cache.store.read(list(hashes))
    finally:
        cache.close()
    stored = {hashes[h]: json.loads(row.timings_json)
              for h, row in rows.items() if row.state == "done" and row.timings_json}
    return stored, sum((row.token or 1) - 1 for row in rows.values())


def read_failed(url: str) -> list[tuple[str, str]]:
    """(key hash, error) of every entry marked failed, read with the driver's own SQL (a
    hostile row may be anything)."""
    sql = "SELECT key_hash, substr(error, 1, 200) FROM tunecache_entries WHERE state = 'failed'"
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.split("///", 1)[1], timeout=60)
        conn.text_factory = lambda b: b.decode(errors="replace")
        try:
            rows = conn.execute(sql).fetchall()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(libpq_url(url), connect_timeout=10) as pg:
            rows = pg.execute(sql).fetchall()
    return [(str(h), ascii(e)) for h, e in rows]


# -- one backend, end to end ---------------------------------------------------------------


def soak(backend: str, opts: Options, workdir: str, pg_url: str | None,
         pg_restart_cmd: str | None) -> dict[str, Any]:
    server = None
    restart_cmd = None
    if backend == "sqlite":
        # A folder of its own: the blob files go beside the database, and everything
        # else in the work dir (the canary folders) is outside the cache.
        os.makedirs(os.path.join(workdir, "cache"), exist_ok=True)
        url = f"sqlite:///{workdir}/cache/soak.db"
    elif pg_url:
        url = pg_url
        if pg_restart_cmd:
            def restart_cmd(mode: str) -> list[str]:
                return ["sh", "-c", pg_restart_cmd]
    else:
        server = PrivatePostgres()
        url, restart_cmd = server.url, server.restart_command
    logdir = os.path.join(workdir, f"logs-{backend}")
    os.makedirs(logdir)
    env = {**os.environ,
           "TUNECACHE_LEASE_SECONDS": str(opts.lease),
           # The most the lease allows (a heartbeat must get the lock in time); a frozen
           # SQLite writer holds the lock longer, and its peers then fall back to local.
           "TUNECACHE_LOCK_TIMEOUT": str(opts.lease / 2),
           "TUNECACHE_WAIT_TIMEOUT": str(max(60.0, 10 * opts.lease)),
           # Kills and freezes cost a key an attempt when its claim is taken over, and
           # are not the tuner's fault: a key should not run out of attempts for them
           # (that takes max_attempts - 1 takeovers in a row). A tuner that raises every
           # time (a poisoned neighbour) exhausts a key in seconds, as jobs ask for it.
           "TUNECACHE_MAX_ATTEMPTS": str(opts.max_attempts),
           "TUNECACHE_TRITON_CONFIGS": "0"}
    driver = Driver(opts, url, logdir, env, restart_cmd,
                    hostile_setup(backend, url, workdir) if opts.hostile else None)
    probe = OutageProbe(url)
    try:
        if server is not None:
            server.start()
        migrate(url)  # before the crowd (and the adversary) arrives
        probe.start()
        driver.run()
        probe.stop()
        with open(os.path.join(logdir, "chaos.json"), "w") as f:  # for --keep's readers
            json.dump({**dataclasses.asdict(driver.chaos), "outages": probe.outages,
                       "t0": driver.t0,
                       "operator": driver.operator.runs if driver.operator else []}, f)
        report = analyse(driver, probe.outages)
    finally:
        probe.stop()
        driver.cleanup()
        if server is not None:
            server.stop()
    return {"backend": backend, "seconds": opts.seconds, "workers": opts.workers,
            "lease_s": opts.lease, "hostile": opts.hostile, **report}


def migrate(url: str) -> None:
    """Create the schema now (opening a cache is lazy: its first use migrates)."""
    cache = tunecache.open(url)
    try:
        if cache.database() is None:
            raise SystemExit(f"soak: cannot use {url}: {cache.disabled_reason}")
    finally:
        cache.close()


def hostile_setup(backend: str, url: str, workdir: str) -> dict[str, Any]:
    """The key pair jobs publish and verify with, the adversary's canary and trash
    folders (outside the cache), and the blob root of a SQLite database."""
    from tunecache.core.signing import write_key_pair
    from tunecache.store.blobs import blob_dir_for

    keydir = os.path.join(workdir, f"keys-{backend}")
    pair = write_key_pair(keydir)
    spec: dict[str, Any] = {
        "keys": {"signing": str(pair.private_key), "verify": str(pair.public_key),
                 "hostile_verify": os.path.join(keydir, "world-writable-verify.pub")},
        "canary": os.path.join(workdir, f"canary-{backend}"),
        "trash": os.path.join(workdir, f"trash-{backend}"),
        "blobs": blob_dir_for(url.split("///", 1)[1]) if backend == "sqlite" else None,
    }
    os.makedirs(spec["canary"])
    os.makedirs(spec["trash"])
    return spec


FIGURES = [
    ("keys", "keys"), ("calls", "calls"), ("tunes_claimed", "tunes under a claim"),
    ("tunes_local", "tunes local (fallback)"), ("kills", "kills"), ("storms", "kill storms"),
    ("freezes", "freezes"), ("long_freezes", "crowd freezes longer than the lease"),
    ("pg_restarts", "PostgreSQL restarts"), ("backends_terminated", "backends terminated"),
    ("outages", "database outages seen by the probe"), ("takeovers", "takeovers"),
    ("duplicates_by_live_owners", "duplicate tunes by live owners"),
    ("divergent", "divergent results"), ("raised", "callers that raised"),
    ("failed", "failed results"), ("local_results", "local results"),
    ("crashes", "worker crashes"), ("hung", "hung workers"),
    ("longest_wait_s", "longest wait (s)"), ("jobs", "jobs"),
    ("tunes_planned", "tunes of a family with a transfer plan"),
    ("peak_rss_mib", "peak worker RSS (MiB)"), ("keys_failed", "keys marked failed"),
]


def print_report(row: dict[str, Any]) -> None:
    print(f"soak {row['backend']}: {row['seconds']:g} s, {row['workers']} workers, "
          f"lease {row['lease_s']:g}s, hang bound {row['hang_bound_s']:g}s")
    for name, label in FIGURES:
        print(f"  {label:<38} {row[name]}")
    for example in row["examples"]:
        print(f"  ! {example}")
    print(f"  {'case':<28} {'planted':>7} {'skipped':>7} {'failed':>6} {'hung':>5} "
          f"{'touched':>7} {'keys failed':>11}")
    for name, c in sorted(row["cases"].items()):
        print(f"  {name:<28} {c['planted']:>7} {c['skipped']:>7} {c['failed']:>6} "
              f"{c['hung']:>5} {c.get('touched', 0):>7} {c['keys_failed']:>11}")
        for example in c["examples"]:
            print(f"    ! {example!a}"[:400])
    for name, label in INVARIANTS:
        verdict = "ok" if row[name] == 0 else "FAILED"
        print(f"  {label:<38} {row[name]}  {verdict}")


# The invariants of the hostile soak (all must be 0).
INVARIANTS = [("jobs_failed", "jobs failed"),
              ("keys_failed_untampered", "keys failed that no one tampered with"),
              ("cli_failed", "CLI commands failed (traceback, output)"),
              ("files_touched", "files outside the cache touched"),
              ("hangs", "hangs")]


def summary(row: dict[str, Any]) -> dict[str, Any]:
    """The JSON summary line: invariants and per-case counts, without examples."""
    return {"soak_summary": row["backend"], "seconds": row["seconds"], "seed": row["seed"],
            "ok": not failed(row), **{name: row[name] for name, _ in INVARIANTS},
            "cases": {name: {k: v for k, v in c.items() if k != "examples"}
                      for name, c in row["cases"].items()}}


def failed(row: dict[str, Any]) -> bool:
    return any(row[k] for k in ("duplicates_by_live_owners", "divergent", "raised",
                                "crashes", "hung", *(name for name, _ in INVARIANTS)))


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=2.0, help="per backend (default 2)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="per backend, instead of --minutes")
    parser.add_argument("--no-hostile", dest="hostile", action="store_false",
                        help="chaos only: no adversary, operator commands or compiled graphs")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--lease", type=float, default=3.0,
                        help="TUNECACHE_LEASE_SECONDS of the workers (default 3)")
    parser.add_argument("--restart-every", type=float, default=30.0,
                        help="seconds between PostgreSQL restarts (default 30)")
    parser.add_argument("--seed", type=int, default=None, help="the chaos's random seed")
    parser.add_argument("--max-attempts", type=int, default=10,
                        help="TUNECACHE_MAX_ATTEMPTS of the workers (default 10)")
    parser.add_argument("--pg-url", default=None,
                        help="an existing server's database instead of a private cluster "
                        "(one the soak may have to itself: it terminates tunecache's "
                        "connections to it)")
    parser.add_argument("--pg-restart-cmd", default=None,
                        help="shell command that restarts the --pg-url server")
    parser.add_argument("--keep", action="store_true", help="keep the logs and SQLite file")
    parser.add_argument("--json", action="store_true", help="one JSON object per backend")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--adversary", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(json.loads(args.worker))
        return 0
    if args.adversary:
        run_adversary(json.loads(args.adversary))
        return 0
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    if seconds <= 0 or args.workers < 2 or args.lease <= 0 or args.max_attempts < 1:
        parser.error("--seconds (--minutes), --lease and --max-attempts must be positive, "
                     "--workers at least 2")
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    opts = Options(seconds, args.workers, args.lease, seed, args.restart_every, args.hostile,
                   args.max_attempts)
    backends = ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]
    # SIGINT and SIGTERM clean up through the finally clauses (SIGINT explicitly: a shell
    # starts background jobs with it ignored, and Python then installs no handler).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = tempfile.mkdtemp(prefix="tunecache-soak-")
    rows = []
    try:
        for backend in backends:
            row = soak(backend, opts, workdir, args.pg_url, args.pg_restart_cmd)
            rows.append({**row, "seed": seed})
            if args.json:
                print(json.dumps(rows[-1]), flush=True)
            else:
                print_report(rows[-1])
                print(json.dumps(summary(rows[-1])), flush=True)
    except KeyboardInterrupt:
        print("soak: interrupted; workers stopped and cleaned up", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"soak: logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(failed(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
