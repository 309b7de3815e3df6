"""The heartbeat: a thread that renews the leases of the claims a process holds."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable

from ..errors import StoreError
from ..store import Claim, ClaimStore

__all__ = ["Heartbeat"]

logger = logging.getLogger("tunecache")


class Heartbeat:
    """Renews the leases of the claims a process holds, every lease/3 seconds."""

    def __init__(self, store: ClaimStore, lease_seconds: float) -> None:
        self.pid = os.getpid()
        self._store = store
        self._lease = lease_seconds
        self._claims: dict[str, Claim] = {}
        self._lock = threading.Lock()  # guards _claims
        self._renewing = threading.Lock()  # held for a whole renewal
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tunecache-heartbeat",
                                        daemon=True)
        self._thread.start()

    def hold(self, claims: Iterable[Claim]) -> None:
        with self._lock:
            for claim in claims:
                self._claims[claim.key_hash] = claim

    def release(self, claims: Iterable[Claim], *, wait: bool = False) -> None:
        """Stop renewing ``claims``. ``wait``: also wait out a renewal in flight, which
        may have read them before; call it before giving claims back, or that renewal
        would hold off peers for another lease."""
        claims = list(claims)
        with self._lock:
            for claim in claims:
                if self._claims.get(claim.key_hash) == claim:
                    del self._claims[claim.key_hash]
        if wait and claims:
            with self._renewing:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._lease / 3):
            with self._renewing:
                with self._lock:
                    claims = list(self._claims.values())
                if not claims:
                    continue
                try:
                    lost = self._store.heartbeat(claims, self._lease)
                except StoreError as e:
                    logger.debug("tunecache: heartbeat failed: %s", e)
                    continue
                with self._lock:
                    # Renewing a lost claim is pointless; one its owner released in the
                    # meantime is its owner's to report (a rejected publish warns).
                    lost_held = [c for c in claims
                                 if c.key_hash in lost and self._claims.get(c.key_hash) == c]
                    for claim in lost_held:
                        del self._claims[claim.key_hash]
            for claim in lost_held:
                logger.warning("tunecache: lost the claim on %s (lease passed)",
                               claim.key_hash[:16])
