"""A worker process: jobs of get_or_tune and get_or_tune_many calls, and graph loads and
publishes, on the keys of the moving window."""

from __future__ import annotations

import logging
import os
import random
import resource
import signal
import time
from typing import Any

import tunecache
from tunecache.keys import Key

from .common import (
    GRAPH_WINDOW,
    KEYS_PER_GENERATION,
    WINDOW,
    EventLog,
    Status,
    generation,
    graph_key,
    graph_payload,
    timings_for,
    with_transfer_meta,
    workload_key,
)


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

        def tune(asked: Key) -> dict[str, float]:
            key = key_of[asked.hash]
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
                found = [cache.get_or_tune(keys[0], lambda: tune(keys[0]))]
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
