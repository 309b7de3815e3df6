"""What a compiled graph's row is: the limits a publish is held to, the row as the job and
the operators see it, how each of its untrusted columns is read back, and its identity
in SQL, shared by the job's statements (:mod:`.artifacts`) and the operators'
(:mod:`.artifact_queries`)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from sqlalchemy import and_, bindparam, func

from . import columns
from .blobs import DIGEST
from .claims import db_now
from .schema import artifacts

__all__ = [
    "Artifact",
    "ArtifactInfo",
    "ARTIFACT_KINDS",
    "MAX_KEY_CHARS",
    "MAX_SIGNATURE_BYTES",
    "MAX_TORCH_CHARS",
    "MAX_PAYLOAD_BYTES",
    "MAX_LABEL_CHARS",
    "TOUCH_SECONDS",
    "NOW",
    "IDENTITY",
    "LAST_USE",
    "validate_identity",
    "validate_put",
    "payload_size",
    "info_of",
]

# The kinds tunecache shares today (Inductor's FX graph and AOTAutograd entries, Triton's
# compiled kernels, Dynamo's shape profiles); any name of this shape is stored (a later
# tunecache may share more).
ARTIFACT_KINDS = ("fxgraph", "autograd", "kernel", "pgo")
_KIND = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
MAX_KEY_CHARS = 512
MAX_SIGNATURE_BYTES = 4096
MAX_TORCH_CHARS = 256
# PostgreSQL's bytea holds at most 1 GB; an FX graph entry of a large model is tens of MB.
MAX_PAYLOAD_BYTES = 512 * 2**20
# A kind or torch label read back longer than this is shown clipped (stats, ls).
MAX_LABEL_CHARS = 1 << 20
# A read records its use only when the stored one is older than this: prune's LRU needs
# days, not seconds, and a write per read would take SQLite's write lock on every hit.
TOUCH_SECONDS = 3600.0

NOW = db_now()
# One row: (kind, key) bound as p_kind and p_key.
IDENTITY = and_(artifacts.c.kind == bindparam("p_kind"),
                artifacts.c.cache_key == bindparam("p_key"))
LAST_USE = func.coalesce(artifacts.c.last_used_at, artifacts.c.created_at)


def validate_identity(kind: Any, key: Any) -> str | None:
    """Why (kind, key) cannot name an artifact, or None."""
    if not isinstance(kind, str) or not _KIND.match(kind):
        return f"kind {str(kind)[:40]!r} is not a lowercase name of at most 32 characters"
    if not isinstance(key, str) or not key:
        return "key is not a non-empty string"
    if len(key) > MAX_KEY_CHARS:
        return f"key has {len(key)} characters, more than {MAX_KEY_CHARS}"
    return None


def validate_put(kind: Any, key: Any, payload: Any, signature: Any,
                 torch_version: Any) -> None:
    """Raise ValueError when these cannot be published (see ArtifactStore.put)."""
    why = validate_identity(kind, key)
    if why is None and not isinstance(payload, (bytes, bytearray, memoryview)):
        why = "payload is not bytes"
    elif why is None and len(payload) > MAX_PAYLOAD_BYTES:
        why = f"payload of {len(payload)} bytes is over {MAX_PAYLOAD_BYTES}"
    elif why is None and (not isinstance(signature, (bytes, bytearray))
                          or not 0 < len(signature) <= MAX_SIGNATURE_BYTES):
        why = f"signature is not 1 to {MAX_SIGNATURE_BYTES} bytes"
    elif why is None and (not isinstance(torch_version, str)
                          or len(torch_version) > MAX_TORCH_CHARS):
        why = f"torch_version is not a string of at most {MAX_TORCH_CHARS} characters"
    if why is not None:
        raise ValueError(f"tunecache artifact not stored: {why}")


@dataclasses.dataclass(frozen=True)
class Artifact:
    kind: str  # "fxgraph", "autograd" (Inductor's FX graph / AOTAutograd cache), "kernel",
    # "pgo" (Dynamo's shape profile)
    key: str  # Inductor's own cache key string (<= 512 chars)
    digest: str  # sha256 hex of payload, computed by the store on put
    signature: bytes  # opaque to the store (made and checked by the core)
    payload: bytes  # compressed bytes exactly as given to put()
    torch_version: str
    created_at: float


@dataclasses.dataclass(frozen=True)
class ArtifactInfo:
    """A row without its payload (ls, prune, export). Columns of the wrong type read as
    None (SQLite keeps whatever a writer put in a column)."""

    kind: str
    key: str
    digest: str | None
    size: int | None
    torch_version: str | None
    created_at: float | None
    last_used_at: float | None
    hits: int | None = None  # loads recorded by jobs

    @property
    def last_use(self) -> float:
        return self.last_used_at or self.created_at or 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def payload_size(value: Any) -> int | None:
    """A payload size read from a row, or None: no whole number from 0 to
    MAX_PAYLOAD_BYTES (what put and replace accept) was written by a tunecache. A hostile
    size is never summed: -10^18 hid every other graph from a byte budget, and 2^63-1
    overflowed SQLite's sum for good."""
    size = columns.integer(value)
    return size if size is not None and 0 <= size <= MAX_PAYLOAD_BYTES else None


def info_of(r: Any) -> ArtifactInfo:
    """The metadata columns of a row (kind, cache_key, digest, size, torch_version,
    created_at, last_used_at, hits), each read as untrusted."""
    return ArtifactInfo(
        kind=columns.text(r.kind, MAX_LABEL_CHARS) or columns.clip(r.kind),
        key=r.cache_key if isinstance(r.cache_key, str) else columns.clip(r.cache_key),
        digest=columns.text(r.digest, 64) if isinstance(r.digest, str)
        and DIGEST.match(r.digest) else None,
        size=payload_size(r.size), torch_version=columns.text(r.torch_version, MAX_TORCH_CHARS),
        created_at=columns.time(r.created_at), last_used_at=columns.time(r.last_used_at),
        hits=columns.integer(r.hits))
