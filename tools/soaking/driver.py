"""The chaos driver: it spawns the workers and the adversary, kills, freezes, restarts
PostgreSQL and terminates its backends."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .common import HANG_LEASES, HOSTILE_EVERY, read_status
from .operator_cli import FINAL_COMMANDS, Operator, kill_group
from .postgres import terminate_backends

# Workers and the adversary run the soak's command, in a mode of their own.
SOAK_SCRIPT = str(Path(__file__).resolve().parents[1] / "soak.py")


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
                [sys.executable, SOAK_SCRIPT, f"--{role}", json.dumps(self.spec)],
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
            kill_group(self.adversary)
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
            kill_group(p)
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
                kill_group(p)
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
            kill_group(p)
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
                kill_group(p)
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
