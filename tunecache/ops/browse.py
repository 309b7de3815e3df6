"""Browsing entries: a listing (`tunecache ls`) and one entry in full (`tunecache show`)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from ..errors import ConfigError, EntryNotFoundError, InvalidEntryError
from ..keys import validate_timings
from ..store import ArtifactStore, Database, engine, listing
from ..store.artifact_queries import GraphFilter
from ..store.claims import lease_passed
from ..store.entry_filter import EntryFilter
from .entries import listing_row, stored_key

__all__ = ["ls", "ls_graphs", "ShownEntry", "show"]


def ls(db: Database, env: EntryFilter | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Entries, most recently updated first."""
    rows = db.run(lambda c: engine.rows(c, listing.select_listing(env, limit)))
    return [listing_row(r) for r in rows]


def ls_graphs(db: Database, where: GraphFilter | None = None,
              limit: int = 50) -> list[dict[str, Any]]:
    """Compiled graphs, most recently used first (their metadata: payloads are not read)."""
    return [info.as_dict() for info in ArtifactStore(db).listing(where, limit)]


_HEX = re.compile(r"^[0-9a-f]{4,64}$")


@dataclasses.dataclass(frozen=True)
class ShownEntry:
    """One entry in full, as `tunecache show` prints it. ``key`` and ``timings`` (fastest
    first, ``ms`` None where the candidate has no timing) are None and () where they do not
    read back, with the reason in ``key_error`` or ``timings_error``. The other columns are
    as stored, unchecked (a hand-edited row may hold anything: the printers escape them)."""

    key_hash: str
    key: Any
    key_error: str | None
    state: Any
    kind: Any
    op: Any
    device: Any
    torch: Any
    triton: Any
    timings: tuple[dict[str, Any], ...]
    timings_error: str | None
    best: Any
    tune_seconds: Any
    owner: Any
    token: Any
    attempts: Any
    lease_expires_at: Any
    error: Any
    lease_expired: bool
    hits: Any
    created_at: Any
    updated_at: Any
    last_used_at: Any
    now: Any


def show(db: Database, prefix: str) -> ShownEntry:
    """One entry, by a unique prefix (at least 4 hex digits) of its key hash."""
    prefix = prefix.strip().lower()
    if not _HEX.match(prefix):
        raise ConfigError("KEY_HASH_PREFIX", prefix, "4 to 64 hex digits of a key hash")
    rows = db.run(lambda c: engine.rows(c, listing.select_by_prefix(prefix, 2)))
    if not rows:
        raise EntryNotFoundError(prefix, "no entry's key hash starts with it; "
                                 "`tunecache ls` lists entries")
    if len(rows) > 1:
        raise EntryNotFoundError(prefix, "more than one entry's key hash starts with it; "
                                 "give more digits")
    r = rows[0]
    key_error = None
    try:
        key: Any = stored_key(r.key_json)
    except ValueError as e:
        key, key_error = None, str(e)
    timings: list[dict[str, Any]] = []
    timings_error = None
    if r.timings_json is not None:
        try:
            parsed = validate_timings(r.timings_json, r.key_hash)
            timings = [{"candidate": k, "ms": None if v == math.inf else v}
                       for k, v in sorted(parsed.items(), key=lambda kv: (kv[1], kv[0]))]
        except InvalidEntryError as e:
            timings_error = e.reason
    return ShownEntry(
        key_hash=r.key_hash, key=key, key_error=key_error, state=r.state,
        kind=r.kind, op=r.op, device=r.device, torch=r.torch_version,
        triton=r.triton_version,
        timings=tuple(timings), timings_error=timings_error, best=r.best,
        tune_seconds=r.tune_seconds, owner=r.owner, token=r.token,
        attempts=r.attempts, lease_expires_at=r.lease_expires_at, error=r.error,
        lease_expired=lease_passed(r.lease_expires_at, r.now),
        hits=r.hits, created_at=r.created_at, updated_at=r.updated_at,
        last_used_at=r.last_used_at, now=r.now,
    )

