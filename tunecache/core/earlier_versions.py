"""The older library versions a database holds entries of, for the upgrade path.

After an upgrade of torch or Triton every key's hash changes with the versions it holds,
so a key of this process finds no entry although the same key, recorded under the
versions before, is there. The upgrade path of each kind (GEMM: inductor/upgrade.py;
Triton configs: inductor/triton/remote.py; users' kernels: user_kernels/sharing.py) looks
for that record. What it needs first is which older versions a device has entries of and
what a key of each looked like in its version fields (the labels carry torch and Triton
only; a key also holds CUDA's version, Triton's own hash, a backend's hash): read here
once per process, kind, device and version of ours, then copied into the caller's key.

Everything read is untrusted: a field is taken only as a short string, and a version is
older only where both are release numbers that say so.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..keys import Key
    from .cache import TuneCache

__all__ = ["EARLIER_VERSIONS", "EarlierVersions", "older", "release"]

log = logging.getLogger("tunecache")

# The newest older versions a key looks for its twin under; a database that kept every
# version since the first still costs each new key one read of a few rows.
EARLIER_VERSIONS = 3
# Keys of one version read to learn its version fields beyond the two the labels carry.
KEYS_PER_VERSION = 4
# A version field is a version or a hash of an installation (Triton's own key of a user
# kernel's environment runs to about 2 KB); anything longer is none.
MAX_FIELD = 4096
_RELEASE = re.compile(r"(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?")


def release(version: str) -> tuple[int, int, int] | None:
    """The release numbers of a version string ("2.13.0+cpu": (2, 13, 0)), or None."""
    m = _RELEASE.match(version)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _order(version: str) -> tuple[int, int, int]:
    return release(version) or (0, 0, 0)


def older(theirs: tuple[str, str], ours: tuple[str, str]) -> bool:
    """Whether (torch, triton) versions ``theirs`` are older than ``ours``: an older torch
    release, or the same one with an older Triton. An unreadable torch is never older; an
    unreadable Triton ("none": not installed) compares as any other."""
    torch_a, torch_b = release(theirs[0]), release(ours[0])
    if torch_a is None or torch_b is None or torch_a > torch_b:
        return False
    return torch_a < torch_b or _order(theirs[1]) < _order(ours[1])


class EarlierVersions:
    """What one process knows of the older versions its database holds: per kind, device,
    version of ours and set of fields, each older version's values of those fields, the
    newest version first (read once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[Any, ...], list[dict[str, str]]] = {}

    def fields(self, cache: TuneCache, kind: str, device: str, ours: tuple[str, str],
               fields: Sequence[str]) -> list[dict[str, str]]:
        """The values of ``fields`` of ``env`` in the keys of ``kind`` on ``device`` that
        older versions than ``ours`` (torch, triton) recorded, at most
        :data:`EARLIER_VERSIONS` versions, the newest first, each distinct set once."""
        memo = (kind, device, *ours, *fields)
        with self._lock:
            if memo in self._known:
                return self._known[memo]
        versions = [v for v in cache.recorded_versions(kind, device) if older(v, ours)]
        versions.sort(key=lambda v: (_order(v[0]), _order(v[1])), reverse=True)
        found: list[dict[str, str]] = []
        for version in versions[:EARLIER_VERSIONS]:
            for sample in cache.keys_of_version(kind, device, version, KEYS_PER_VERSION):
                values = env_fields(sample, fields)
                if values is not None and (values.get("torch"), values.get("triton")) \
                        == version and values not in found:
                    found.append(values)
        if found:
            log.debug("tunecache: %s keys without an entry start from older versions' "
                      "entries where they have one: %s", kind, found)
        with self._lock:
            self._known[memo] = found
        return found


    def older_envs(self, cache: TuneCache, key: Key, fields: Sequence[str]
                   ) -> list[tuple[dict[str, Any], dict[str, str]]]:
        """``key``'s env as each older version recorded it: (the env with that version's
        values of ``fields``, those values), the newest first (:meth:`fields`); empty
        where the key has no env or no kind or device label."""
        env = key.mapping.get("env")
        kind, device = key.labels.get("kind"), key.labels.get("device")
        if not isinstance(env, Mapping) or kind is None or device is None:
            return []
        ours = (str(env.get("torch")), str(env.get("triton")))
        out = []
        for values in self.fields(cache, kind, device, ours, fields):
            old_env = {**env, **values}
            if old_env != env:
                out.append((old_env, values))
        return out


def env_fields(key: Mapping[str, Any], fields: Sequence[str]) -> dict[str, str] | None:
    """The values of ``fields`` in a recorded key's ``env`` (each a string of at most
    :data:`MAX_FIELD` characters; a field it lacks is left out), or None where one is
    anything else."""
    env = key.get("env")
    if not isinstance(env, Mapping):
        return None
    found = {f: env[f] for f in fields if f in env}
    if not all(isinstance(v, str) and len(v) <= MAX_FIELD for v in found.values()):
        return None
    return found
