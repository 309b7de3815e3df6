"""Usage counters: hits, sources and compiled artifacts' loads counted in memory until they
are written to the store."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from .result import Result

__all__ = ["Usage"]


class Usage:
    """Hits, sources and artifact loads counted in memory, written by
    ``TuneCache.flush_usage``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._hits: dict[str, int] = {}
        self._counts: dict[str, float] = {}
        # Compiled artifacts (graphs, kernels) loaded: (kind, key) -> (loads, wall-clock
        # time of the last one)
        self._artifact_uses: dict[tuple[str, str], tuple[int, float]] = {}

    def add(self, results: Iterable[Result]) -> None:
        with self._lock:
            for r in results:
                self._counts[r.source] = self._counts.get(r.source, 0) + 1
                if r.source in ("hit", "peer"):
                    self._hits[r.key_hash] = self._hits.get(r.key_hash, 0) + 1
                    saved = self._counts.get("seconds_saved", 0.0) + (r.tune_seconds or 0.0)
                    self._counts["seconds_saved"] = saved
                elif r.source in ("tuned", "local"):
                    spent = self._counts.get("seconds_tuning", 0.0) + (r.tune_seconds or 0.0)
                    self._counts["seconds_tuning"] = spent

    def add_artifact_use(self, kind: str, key: str) -> None:
        """A compiled artifact was loaded (its time kept to the second, for `ls --graphs`)."""
        with self._lock:
            n, _ = self._artifact_uses.get((kind, key), (0, 0.0))
            self._artifact_uses[(kind, key)] = (n + 1, time.time())

    def take(self) -> tuple[dict[str, int], dict[str, float]]:
        with self._lock:
            hits, counts = self._hits, self._counts
            self._hits, self._counts, self._since = {}, {}, time.monotonic()
            return hits, counts

    def take_artifact_uses(self) -> dict[tuple[str, str], tuple[int, float]]:
        with self._lock:
            uses, self._artifact_uses = self._artifact_uses, {}
            return uses

    def age(self) -> float:
        return time.monotonic() - self._since
