"""Whether a process uses the shared cache: the failure policy.

The database is checked (and, in readwrite mode, migrated) to the head schema once per
process. The first store error, or ``TUNECACHE_MODE=off``, sends the process to tuning
locally from then on, with one warning: a job is never slowed twice by the same broken
database.
"""

from __future__ import annotations

import logging
import os
import threading

from ..errors import TuneCacheError
from ..settings import Settings
from ..store import Database, ensure_schema

__all__ = ["Availability"]

logger = logging.getLogger("tunecache")


class Availability:
    """Whether a :class:`~tunecache.core.cache.TuneCache` still uses its database; shared
    with its :class:`~tunecache.core.claimant.Claimant`, so that a store error met by
    either sends both to tuning locally."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self._db = db
        self._settings = settings
        self._lock = threading.RLock()
        self._schema_pid = -1
        # Why this process tunes locally (None while the shared cache is in use).
        self.reason: str | None = "TUNECACHE_MODE=off" if settings.mode == "off" else None

    def ensure(self) -> bool:
        """Whether the shared cache is in use: the schema at head in this process, and no
        store error met so far."""
        if self.reason:
            return False
        pid = os.getpid()
        if self._schema_pid == pid:
            return True
        with self._lock:
            if self._schema_pid != pid and not self.reason:
                try:
                    ensure_schema(self._db, may_migrate=self._settings.mode == "readwrite")
                    self._schema_pid = pid
                except TuneCacheError as e:
                    self.disable(e)
        return not self.reason

    def disable(self, error: BaseException) -> None:
        """Tune locally in this process from now on; only the first error is logged."""
        with self._lock:
            if self.reason:
                return
            self.reason = str(error)
        logger.warning("tunecache: %s; tuning locally in this process from now on", error)
