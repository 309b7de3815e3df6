"""One backend end to end, and the command line (tools/soak.py runs :func:`main`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import signal
import sys
import tempfile
from typing import Any

import tunecache

from .adversary import run_adversary
from .driver import Driver, Options
from .postgres import OutageProbe, PrivatePostgres
from .verdict import analyse, failed, print_report, summary
from .worker import run_worker


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
           "TUNECACHE_SHARE": "-triton"}
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


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def main(doc: str) -> int:
    """The command; ``doc``: its documentation (tools/soak.py's), for --help."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
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
