"""Waking waiters early when a key settles: NOTIFY on PostgreSQL, a plain sleep elsewhere.

A transaction that publishes or gives back a key sends one ``NOTIFY`` (delivered at commit,
so a waiter woken by it reads the new rows). A waiter LISTENs while it sleeps. Polling stays
the source of truth: a notification only cuts a sleep short, and SQLite, which has none,
just sleeps.
"""

from __future__ import annotations

import logging
import math
import os
import time

from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

from .engine import Database

__all__ = ["NOTIFY_CHANNEL", "PG_ROOM_TO_LISTEN", "notify", "Waiter"]

logger = logging.getLogger("tunecache")

NOTIFY_CHANNEL = "tunecache_done"
_NOTIFY = text(f"NOTIFY {NOTIFY_CHANNEL}")

# Whether the server has connection slots to spare for a waiter's LISTEN connection: under
# half of each limit in use (max_connections less its reserved slots, the database's and
# the role's CONNECTION LIMIT). Waiters that each held one left none for the processes
# whose results they waited for.
PG_ROOM_TO_LISTEN = """
SELECT 2 * (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')
         <= current_setting('max_connections')::int
            - current_setting('superuser_reserved_connections')::int
            - coalesce(current_setting('reserved_connections', true), '0')::int
   AND (d.datconnlimit < 0
        OR 2 * (SELECT count(*) FROM pg_stat_activity WHERE datid = d.oid) <= d.datconnlimit)
   AND (r.rolconnlimit < 0
        OR 2 * (SELECT count(*) FROM pg_stat_activity WHERE usesysid = r.oid) <= r.rolconnlimit)
FROM pg_database d, pg_roles r
WHERE d.datname = current_database() AND r.rolname = current_user
"""


def notify(conn: Connection, dialect: str) -> None:
    """Tell waiters, at commit, that a key settled. One per transaction and without a
    payload: waiters re-read what they wait for anyway."""
    if dialect == "postgresql":
        conn.execute(_NOTIFY)


class Waiter:
    """Sleeps for one process, woken early by a :func:`notify` where the database has one.

    On PostgreSQL it LISTENs on a connection opened for one wait and closed at its end, and
    only while the server has slots to spare: at cluster scale, waiters that each held one
    for their life left no slot for the processes whose results they waited for.
    """

    # Shorter sleeps are not worth a connection.
    _MIN_SECONDS = 0.1
    # After finding the server crowded, sleep without asking it again for this long.
    _CROWDED_SECONDS = 5.0

    def __init__(self, db: Database) -> None:
        self.pid = os.getpid()
        self._listens = db.dialect == "postgresql"
        self._conninfo = (
            make_url(db.url).set(drivername="postgresql").render_as_string(hide_password=False)
            if self._listens else ""
        )
        self._quiet_until = 0.0

    def wait(self, timeout: float) -> None:
        """Return after ``timeout`` seconds, or sooner if a key settles meanwhile."""
        if not (self._listens and self._listen(timeout)):
            time.sleep(timeout)

    def _listen(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a notification; False: nothing waited, sleep instead."""
        if timeout < self._MIN_SECONDS or time.monotonic() < self._quiet_until:
            return False
        try:
            import psycopg  # the PostgreSQL driver: present only with the postgresql extra

            with psycopg.connect(self._conninfo, autocommit=True,
                                 connect_timeout=max(2, math.ceil(timeout))) as conn:
                room = conn.execute(PG_ROOM_TO_LISTEN).fetchone()
                if not (room and room[0]):
                    self._quiet_until = time.monotonic() + self._CROWDED_SECONDS
                    return False
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                for _ in conn.notifies(timeout=timeout, stop_after=1):
                    break
            return True
        except Exception as e:  # noqa: BLE001 - any failure here just means polling
            logger.debug("tunecache: LISTEN unavailable, polling: %s", e)
            self._quiet_until = time.monotonic() + self._CROWDED_SECONDS
            return False
