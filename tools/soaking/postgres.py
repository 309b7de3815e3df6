"""The database under the soak: a private PostgreSQL cluster, the outage probe, and
backend terminations."""

from __future__ import annotations

import os
import random
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from typing import Any

from .common import PG_BIN


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
