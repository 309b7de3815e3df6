"""After an upgrade: a Triton kernel with no entry under this torch/Triton starts its
tuning from its own coordinate-descent result under an older one, as transfer starts from
a neighbour (coordesc.py's ``_transfer``: that config is benchmarked beside the one the
descent starts from, and the faster is the result; nothing is decided unmeasured).

Finding the record
    A Triton key holds Inductor's key of the kernel, which hashes torch's sources, and
    the hash of the generated source, which names torch's and Triton's flags: an upgrade
    changes both, so the old key cannot be rebuilt from the new one (a GEMM's can,
    inductor/upgrade.py). The old record is found by its labels instead: the entries of
    the kernel's op (its name without the per-graph counter) on this device under the
    newest older version that has one (tunecache.store.earlier_queries.entries_of_op),
    of which those at exactly this kernel's sizes whose key is this one's but for the
    library versions (:data:`UPGRADE_KEY_FIELDS`; the env differs in
    :data:`~..fingerprint.LIBRARY_FIELDS` alone) and whose timings hold a
    coordinate-descent result are sources.

What a wrong match costs
    Two kernels of one name at one size are rare but possible (descriptive names count
    the ops, not their order): each record's config is then benchmarked too, one
    benchmark each, and only a config this kernel can have (``neighbour_config``'s
    checks) ever runs. The entry the kernel publishes is one of the new version, with
    ``meta["transfer"]["from_version"]``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Set
from typing import TYPE_CHECKING, Any

from ...core.earlier_versions import EarlierVersions
from ...keys import Key
from ..fingerprint import LIBRARY_FIELDS
from .kernel_keys import SIZES_FIELD, coordesc_result

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ...core.cache import TuneCache

__all__ = ["TritonUpgrades", "UPGRADE_KEY_FIELDS"]

KIND = "triton_config"
# The fields an old version's record of the same kernel has as this key has them, beside
# its op, device, sizes and env.
UPGRADE_KEY_FIELDS = ("kind", "device_type", "heuristic", "coordesc", "tag")


class TritonUpgrades:
    """One process's upgrade sources of Triton kernels, and the versions each came from."""

    def __init__(self) -> None:
        self._earlier = EarlierVersions()
        self._lock = threading.Lock()
        # key hash of an older version's record that was a source -> its library versions
        self._from_version: dict[str, dict[str, str]] = {}

    def sources(self, cache: TuneCache, key: Key, sizes: Mapping[str, int],
                refused: Set[str]) -> list[tuple[str, dict[str, Any], Mapping[str, Any]]]:
        """(key hash, best-config dict, meta) of ``key``'s records under the newest older
        version that has any (this module's docstring); none of ``refused``."""
        op, device = key.labels.get("op"), key.labels.get("device")
        if op is None or device is None:
            return []
        for old_env, fields in self._earlier.older_envs(cache, key, LIBRARY_FIELDS):
            versions = (fields.get("torch", ""), fields.get("triton", ""))
            found = []
            for n in cache.entries_of_op(KIND, op, device, versions):
                best = coordesc_result(n.timings)
                if (best is not None and n.key_hash not in refused
                        and n.key.get("env") == old_env and n.meta.get(SIZES_FIELD) == sizes
                        and all(n.key.get(f) == key.mapping.get(f) for f in UPGRADE_KEY_FIELDS)):
                    found.append((n.key_hash, best, n.meta))
            if found:
                with self._lock:
                    self._from_version.update((h, dict(fields)) for h, _, _ in found)
                return found
        return []

    def from_version(self, key_hashes: list[str]) -> dict[str, str] | None:
        """The library versions of the first of ``key_hashes`` that was an older version's
        record (:meth:`sources`), or None."""
        with self._lock:
            for key_hash in key_hashes:
                if key_hash in self._from_version:
                    return dict(self._from_version[key_hash])
        return None
