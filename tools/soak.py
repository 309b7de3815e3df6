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
workers are not all zero.

PostgreSQL: by default a private throwaway cluster (initdb into a temp dir, as the
``postgres`` user when run as root, on a free port), restarted at will and removed at the
end; the shared server on 5432 is never touched. ``--pg-url`` uses an existing server
instead: backends are still terminated, but restarts need ``--pg-restart-cmd``.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import logging
import os
import random
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
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tunecache  # noqa: E402
from tunecache.keys import key_hash  # noqa: E402

PG_BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
KEYS_PER_GENERATION = 4  # new keys per GENERATION_SECONDS: a steady stream of cold keys
GENERATION_SECONDS = 1.0
WINDOW = 6  # keys one call may ask for, from the current generation on


# -- the worker ----------------------------------------------------------------------------


def soak_key(run: str, i: int) -> dict[str, Any]:
    return {"kind": "soak", "op": "mm", "run": run, "i": i}


def timings_for(pid: int, i: int) -> dict[str, float]:
    """Deterministic per (process, key) and different between processes: a key tuned
    twice, or a result taken from the wrong tuner, shows as a difference."""
    rng = random.Random(f"{pid}:{i}")
    return {name: round(rng.uniform(0.1, 2.0), 6) for name in ("aten", "triton_a", "triton_b")}


class EventLog:
    """Append-only JSON lines, one file per process; one write(2) per line, so a SIGKILL
    never leaves half a line behind another."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **record: Any) -> None:
        os.write(self._fd, (json.dumps(record) + "\n").encode())


class Worker:
    """A worker process: jobs (open, one to four calls, close) until the deadline. Its
    settings are the TUNECACHE_* variables the driver set."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.pid = os.getpid()
        self.rng = random.Random(f"{spec['seed']}:{self.pid}")
        self.log = EventLog(os.path.join(spec["logdir"], f"events-{self.pid}.jsonl"))
        self.lease = float(os.environ["TUNECACHE_LEASE_SECONDS"])
        self.calls = 0

    def run(self) -> None:
        while time.time() < self.spec["deadline"]:
            cache = tunecache.open(self.spec["url"])
            # A job with a nearly free tuner (a warm local cache, say) makes
            # get_or_tune_many claim keys in batches; one slow key among them must not
            # cost the others their leases.
            cheap = self.rng.random() < 0.3
            for _ in range(self.rng.randint(1, 4)):
                if time.time() >= self.spec["deadline"]:
                    break
                self.call(cache, cheap)
            try:
                cache.close()
            except Exception as e:  # noqa: BLE001 - counted like a call that raised
                self.log.write(ev="call", pid=self.pid, call=-1, start=time.time(),
                               end=time.time(), results={}, raised=f"close: {e!r}")

    def call(self, cache: Any, cheap: bool) -> None:
        """One get_or_tune or get_or_tune_many on keys of the moving window; logs the
        results, or what it raised."""
        self.calls += 1
        call, rng = self.calls, self.rng
        generation = int((time.time() - self.spec["t0"]) / GENERATION_SECONDS)
        first = generation * KEYS_PER_GENERATION + rng.randint(0, 2)
        numbers = list(range(first, first + rng.randint(1, WINDOW * (4 if cheap else 1))))
        one = rng.random() < 0.5
        if one:
            numbers = [rng.choice(numbers)]

        def tune(key: Any) -> dict[str, float]:
            self.log.write(ev="tune", pid=self.pid, call=call, i=key["i"], t=time.time(),
                           local=cache.disabled_reason is not None)
            # Now and then longer than the lease: only the heartbeat keeps the claim.
            if rng.random() < (0.03 if cheap else 0.15):
                time.sleep(1.3 * self.lease)
            else:
                time.sleep(0.0005 if cheap else rng.uniform(0.05, 0.3))
            return timings_for(self.pid, key["i"])

        keys = [soak_key(self.spec["run"], i) for i in numbers]
        start, raised, results = time.time(), None, {}
        try:
            if one:
                found = [cache.get_or_tune(keys[0], lambda: tune(keys[0]))]
            else:
                found = cache.get_or_tune_many(keys, tune)
            results = {str(i): [r.source, r.timings] for i, r in zip(numbers, found)}
        except tunecache.KeyFailedError:
            results = {str(numbers[0]): ["failed", None]}
        except Exception as e:  # noqa: BLE001 - a caller that raised is what we count
            raised = f"{type(e).__name__}: {e}"
        self.log.write(ev="call", pid=self.pid, call=call, start=start, end=time.time(),
                       results=results, raised=raised)


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


# -- the chaos driver ----------------------------------------------------------------------


@dataclasses.dataclass
class Options:
    minutes: float
    workers: int
    lease: float
    seed: int
    restart_every: float


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


class Driver:
    """Keeps ``workers`` worker processes running until the deadline and hurts them."""

    def __init__(self, opts: Options, url: str, logdir: str, env: dict[str, str],
                 restart_cmd: Any) -> None:
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
        self.deadline = self.t0 + opts.minutes * 60
        self.spec = {"url": url, "logdir": logdir, "run": uuid.uuid4().hex[:12],
                     "seed": opts.seed, "t0": self.t0, "deadline": self.deadline}

    def spawn(self) -> subprocess.Popen[bytes]:
        self.spawned += 1
        out = open(os.path.join(self.logdir, f"worker-{self.spawned}.log"), "wb")
        with out:
            return subprocess.Popen(
                [sys.executable, __file__, "--worker", json.dumps(self.spec)],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def run(self) -> None:
        self.procs = [self.spawn() for _ in range(self.opts.workers)]
        next_event = time.time() + 2.0
        next_restart = time.time() + self.opts.restart_every
        while time.time() < self.deadline:
            self._reap()
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
            p.kill()
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

    def _finish(self) -> None:
        """Let the last calls end (bounded by the worst case of a wait: no progress for
        the wait timeout, then a lock timeout), then kill whatever is left."""
        self._end_restart()
        bound = time.time() + float(self.env["TUNECACHE_WAIT_TIMEOUT"]) \
            + 2 * float(self.env["TUNECACHE_LOCK_TIMEOUT"]) + 60
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, bound - time.time()))
            except subprocess.TimeoutExpired:
                self.chaos.hung += 1
        for p in self.procs:
            if p.returncode not in (None, 0) and p.pid not in self.chaos.died:
                self.chaos.crashes.append(f"worker {p.pid} exited with {p.returncode}")

    def cleanup(self) -> None:
        """On any exit: no worker left stopped or running, no restart left behind."""
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
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
    for ev in read_events(driver.logdir):
        if ev["ev"] == "tune":
            tunes.setdefault((ev["pid"], ev["call"]), []).append(ev)
        else:
            calls.append(ev)
    # A tune is local if the cache was already disabled when it started, or if it is the
    # last tune of a key in a call whose result for that key was local (a wait timeout).
    for call in calls:
        for i, (source, _) in call["results"].items():
            if source == "local":
                mine = [t for t in tunes.get((call["pid"], call["call"]), []) if t["i"] == int(i)]
                if mine:
                    mine[-1]["local"] = True
    claimed: dict[int, list[tuple[float, int]]] = {}
    local_tunes = 0
    for events in tunes.values():
        for t in events:
            if t["local"]:
                local_tunes += 1
            else:
                claimed.setdefault(t["i"], []).append((t["t"], t["pid"]))

    freezes_by_pid: dict[int, list[tuple[float, float]]] = {}
    for pid, a, b in chaos.freezes:
        freezes_by_pid.setdefault(pid, []).append((a, b))
    down = outages + chaos.restarts

    def excused(pid: int, start: float, end: float) -> bool:
        return (chaos.died.get(pid, float("inf")) <= end
                or _overlaps(freezes_by_pid.get(pid, []), start, end, lease / 2)
                or _overlaps(down, start, end, lease / 2))

    duplicates = []
    for i, starts in claimed.items():
        starts.sort()
        for (t1, p1), (t2, p2) in zip(starts, starts[1:]):
            if not excused(p1, t1, t2):
                duplicates.append(f"key {i}: pid {p1} at {t1 - driver.t0:.1f}s, "
                                  f"pid {p2} at {t2 - driver.t0:.1f}s")

    numbers = {int(i) for c in calls for i in c["results"]} | set(claimed)
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
    }


def read_stored(url: str, run: str, numbers: set[int]) -> tuple[dict[int, Any], int]:
    """Stored timings of done keys by number, and the takeovers (every claim after a
    key's first bumps its fencing token), read through tunecache's own store."""
    hashes = {key_hash(soak_key(run, i))[0]: i for i in numbers}
    cache = tunecache.open(url)
    try:
        rows = cache.store.read(list(hashes))
    finally:
        cache.close()
    stored = {hashes[h]: json.loads(row.timings_json)
              for h, row in rows.items() if row.state == "done" and row.timings_json}
    return stored, sum(row.token - 1 for row in rows.values())


# -- one backend, end to end ---------------------------------------------------------------


def soak(backend: str, opts: Options, workdir: str, pg_url: str | None,
         pg_restart_cmd: str | None) -> dict[str, Any]:
    server = None
    restart_cmd = None
    if backend == "sqlite":
        url = f"sqlite:///{workdir}/soak.db"
    elif pg_url:
        url = pg_url
        if pg_restart_cmd:
            restart_cmd = lambda mode: ["sh", "-c", pg_restart_cmd]  # noqa: E731
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
           # Kills are not the tuner's fault: a key should never run out of attempts here.
           "TUNECACHE_MAX_ATTEMPTS": "1000",
           "TUNECACHE_TRITON_CONFIGS": "0"}
    driver = Driver(opts, url, logdir, env, restart_cmd)
    probe = OutageProbe(url)
    try:
        if server is not None:
            server.start()
        tunecache.open(url).close()  # migrate before the crowd arrives
        probe.start()
        driver.run()
        probe.stop()
        with open(os.path.join(logdir, "chaos.json"), "w") as f:  # for --keep's readers
            json.dump({**dataclasses.asdict(driver.chaos), "outages": probe.outages,
                       "t0": driver.t0}, f)
        report = analyse(driver, probe.outages)
    finally:
        probe.stop()
        driver.cleanup()
        if server is not None:
            server.stop()
    return {"backend": backend, "minutes": opts.minutes, "workers": opts.workers,
            "lease_s": opts.lease, **report}


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
    ("longest_wait_s", "longest wait (s)"),
]


def print_report(row: dict[str, Any]) -> None:
    print(f"soak {row['backend']}: {row['minutes']:g} min, {row['workers']} workers, "
          f"lease {row['lease_s']:g}s")
    for name, label in FIGURES:
        print(f"  {label:<38} {row[name]}")
    for example in row["examples"]:
        print(f"  ! {example}")


def failed(row: dict[str, Any]) -> bool:
    return any(row[k] for k in ("duplicates_by_live_owners", "divergent", "raised",
                                "crashes", "hung"))


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=2.0, help="per backend (default 2)")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--lease", type=float, default=3.0,
                        help="TUNECACHE_LEASE_SECONDS of the workers (default 3)")
    parser.add_argument("--restart-every", type=float, default=30.0,
                        help="seconds between PostgreSQL restarts (default 30)")
    parser.add_argument("--seed", type=int, default=None, help="the chaos's random seed")
    parser.add_argument("--pg-url", default=None,
                        help="an existing server's database instead of a private cluster "
                        "(one the soak may have to itself: it terminates tunecache's "
                        "connections to it)")
    parser.add_argument("--pg-restart-cmd", default=None,
                        help="shell command that restarts the --pg-url server")
    parser.add_argument("--keep", action="store_true", help="keep the logs and SQLite file")
    parser.add_argument("--json", action="store_true", help="one JSON object per backend")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(json.loads(args.worker))
        return 0
    if args.minutes <= 0 or args.workers < 2 or args.lease <= 0:
        parser.error("--minutes and --lease must be positive, --workers at least 2")
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    opts = Options(args.minutes, args.workers, args.lease, seed, args.restart_every)
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
