"""A PostgreSQL server that restarts under a running job, on a private throwaway cluster.

The shared server of the test suite is never restarted; this module makes its own cluster
(initdb into tmp, a free port; as root the server runs as the ``postgres`` user, since
initdb refuses root) and stops it at the end.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import event

import tunecache

PG_BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    def __init__(self, root: str) -> None:
        self.root = root
        self.data = os.path.join(root, "data")
        self.port = _free_port()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(root, "postgres")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def pg_ctl(self, *args: str) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
        subprocess.run([*self.as_user, f"{PG_BIN[-1]}/pg_ctl", "-D", self.data, "-o", options,
                        "-l", os.path.join(self.root, "server.log"), "-w", "-t", "60", *args],
                       check=True, capture_output=True, timeout=120)

    def create(self) -> None:
        subprocess.run([*self.as_user, f"{PG_BIN[-1]}/initdb", "-D", self.data, "-A", "trust",
                        "-U", "postgres", "--no-sync"], check=True, capture_output=True,
                       timeout=120)
        self.pg_ctl("start")


@pytest.fixture
def server() -> Iterator[PrivateServer]:
    if not PG_BIN:
        pytest.fail("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    # Not under pytest's tmp_path: its parents are private to root, and the server runs
    # as postgres.
    root = tempfile.mkdtemp(prefix="tunecache-test-pg-")
    srv = PrivateServer(root)
    try:
        srv.create()
        yield srv
    finally:
        subprocess.run([*srv.as_user, f"{PG_BIN[-1]}/pg_ctl", "-D", srv.data, "-m",
                        "immediate", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def test_server_restart_within_the_lock_timeout_is_waited_out_not_a_fallback(server, caplog):
    """A restart refuses connections for a moment. Every process that touched the database
    then tuned locally for the rest of its job (tools/soak.py: 213-291 local results in
    two minutes); now it waits, within the lock timeout, as it would for a lock."""
    cache = tunecache.open(server.url, lease_seconds=60, lock_timeout=30)
    try:
        assert cache.get_or_tune({"k": 1}, tune=lambda: {"a": 1.0}).source == "tuned"
        server.pg_ctl("-m", "fast", "stop")
        # The server comes back once the cache has been refused and has tried again, so it
        # is waiting the restart out (a timer could fire before the call even began).
        attempts: list[int] = []
        retried = threading.Event()

        def attempt(*_args: object) -> None:
            attempts.append(1)
            if len(attempts) >= 2:
                retried.set()

        event.listen(cache.store.db.engine, "do_connect", attempt)
        back = threading.Thread(target=lambda: (retried.wait(120), server.pg_ctl("start")))
        back.start()
        try:
            second = cache.get_or_tune({"k": 2}, tune=lambda: {"a": 2.0})
        finally:
            retried.set()
            back.join()
        assert len(attempts) >= 2, attempts  # the first refused (the server was down), retried
        assert second.source == "tuned", caplog.text
        assert cache.disabled_reason is None
        assert cache.lookup({"k": 2}) is not None
    finally:
        cache.close()


def test_server_that_was_never_reached_is_unreachable_at_once(caplog):
    """Waiting out a refused connection is for a server this process has reached before;
    one that is not there at all is a fallback at once, not after the lock timeout."""
    cache = tunecache.open(f"postgresql://postgres@127.0.0.1:{_free_port()}/x",
                           lease_seconds=120, lock_timeout=60)
    try:
        started = time.monotonic()
        result = cache.get_or_tune({"k": 1}, tune=lambda: {"a": 1.0})
        assert result.source == "local"
        assert time.monotonic() - started < 30  # the lock timeout is 60 s
    finally:
        cache.close()
