"""After an upgrade: a GEMM key with no entry under this torch/Triton starts from its own
entry under an older one, as transfer starts from a neighbour (transfer.py).

The same key under another version
    A key's environment fingerprint holds the library versions
    (:data:`~.fingerprint.LIBRARY_FIELDS`: torch, Triton, CUDA, HIP); an upgrade changes
    them and so every key's hash. The key with this key's fields but an older version's
    library fields is the same GEMM on the same device, threads, flags and precision,
    recorded before the upgrade. The older versions a device has entries of are read
    once per process (tunecache/core/earlier_versions.py); then each new key's older twins
    are read by hash, the newest version first. A database with
    no older version costs one indexed read per device and process.

What is carried
    The old winner and the templates the old margin did not separate from it (within
    :data:`~.transfer.DECISIVE_MARGIN` of its time), at most
    :data:`~.transfer.FROM_NEAREST`, matched by :func:`~.transfer.transfer_id`; extern
    kernels (ATen) are always benchmarked, as in transfer. Where the old winner beat its
    runner-up by the decisive margin (:func:`~.transfer.decisive_winner`, the rule
    neighbours decide by, with the decisive_gemm lever on), it alone is
    chosen: generated alone where narrowing applies, and else decided at the lookup with
    nothing benchmarked, provided it is exactly one of this call's candidates. Candidates
    that no longer exist are not carried; if none of the carried templates is among
    this call's, the key is tuned in full.

The new entry
    A real entry of the new version: its timings are what this version measured (or,
    decided, the old winner's time), and ``meta["transfer"]`` names the old entry
    (``from``) and the library versions it was recorded under (``from_version``), with
    how many candidates were benchmarked of how many. Later jobs hit it as any entry.

Never a decision from a bad row
    An old record is a source only if its finite times are positive and bounded
    (:func:`tunecache.measured.all_measured`, the check every decision shares), one of
    them is finite, and its winner is exactly one of this
    call's candidates (else the key is tuned in full); one that decides must name
    exactly one of them too. A planted row may cost a benchmark, never a decision.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import measured
from ..core.earlier_versions import EarlierVersions, older
from ..keys import Key
from ..measured import MAX_MS
from .fingerprint import LIBRARY_FIELDS
from .transfer import (
    DECISIVE_MARGIN,
    FROM_NEAREST,
    Plan,
    decisive_winner,
    gemm_family,
    transfer_id,
    winner_and_margin,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..core.cache import TuneCache
    from ..core.result import Neighbour

__all__ = ["MAX_MS", "UpgradePlan", "Upgrades", "older", "plan_upgrade"]

@dataclasses.dataclass(frozen=True)
class UpgradePlan(Plan):
    """A transfer plan from the key's own entry under older library versions
    (``from_version``: the fields that differ from this key's, as they were)."""

    from_version: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The old winner's identity (a template's transfer_id, an extern kernel's id)
    old_winner: str | None = None

    def meta(self, benchmarked: int, generated: int) -> dict[str, Any]:
        meta = super().meta(benchmarked, generated)
        meta["transfer"]["from_version"] = dict(self.from_version)
        return meta

    def applies(self, ids: Sequence[str]) -> bool:
        """An old record whose winner is none of this call's candidates is no source."""
        return self.old_winner is not None and _named(self.old_winner, ids) is not None

    def decided_id(self, ids: Sequence[str]) -> str | None:
        """The one of this call's candidate ``ids`` the old record decided, or None: no
        decision, or it names none (or more than one) of them."""
        winner, ms = self.winner, self.winner_ms
        if winner is None or not measured.is_measured(ms):
            return None
        return _named(winner, ids)


def _named(identity: str, ids: Sequence[str]) -> str | None:
    """The one of the candidate ``ids`` that ``identity`` (an id, or a transfer_id)
    names, or None."""
    return measured.one_of(identity, ids, transfer_id)


def plan_upgrade(key: Key, records: Sequence[tuple[Neighbour, Mapping[str, str]]],
                 decisive: bool = False) -> UpgradePlan | None:
    """The plan for ``key`` from its own entries under older versions (``records``:
    each with the library fields it was recorded under, the newest version first), or
    None where none is a source (this module's docstring)."""
    env = key.mapping.get("env")
    env = env if isinstance(env, Mapping) else {}
    for record, libraries in records:
        if not measured.all_measured(record.timings):
            continue
        ranked = sorted((ms, c) for c, ms in record.timings.items() if math.isfinite(ms))
        best_ms = ranked[0][0]
        templates = [(ms, tid) for ms, c in ranked if (tid := transfer_id(c)) is not None]
        first = winner_and_margin(record.timings)
        if not templates or first is None:
            continue  # nothing to narrow by, or a winner we cannot match: tuned in full
        ids: list[str] = []
        for ms, tid in templates:
            if (not ids or ms <= best_ms * (1 + DECISIVE_MARGIN)) and tid not in ids:
                ids.append(tid)
        winner = decisive_winner([_as_tuned(record)]) if decisive else None
        changed = {f: str(libraries[f]) for f in LIBRARY_FIELDS
                   if f in libraries and libraries[f] != env.get(f)}
        return UpgradePlan(frozenset(ids[:FROM_NEAREST]), (record.key_hash,), winner,
                           best_ms if winner is not None else None, changed, first[0])
    return None


def _as_tuned(record: Neighbour) -> Neighbour:
    """``record``, read as tuned in full where its transfer benchmarked every candidate it
    generated (a CPU GEMM has two or three): its runner-up is then the real one, which is
    all that neighbours_agreement refuses a transferred entry for."""
    moved = record.meta.get("transfer")
    if not isinstance(moved, Mapping):
        return record
    benchmarked, generated = moved.get("benchmarked"), moved.get("generated")
    if not (type(benchmarked) is int and type(generated) is int
            and 0 < generated <= benchmarked):
        return record
    meta = {k: v for k, v in record.meta.items() if k != "transfer"}
    return dataclasses.replace(record, meta=meta)


class Upgrades:
    """What one process knows of the older versions its database holds
    (:class:`tunecache.core.earlier_versions.EarlierVersions`), for GEMM keys."""

    def __init__(self) -> None:
        self._earlier = EarlierVersions()

    def plan(self, cache: TuneCache, key: Key, decisive: bool) -> UpgradePlan | None:
        """The upgrade plan for ``key`` (None: none of its older twins is a source)."""
        twins = self.earlier_keys(cache, key)
        if not twins:
            return None
        found = {n.key_hash: n for n in cache.recorded([k for k, _ in twins])}
        records = [(found[k.hash], libs) for k, libs in twins if k.hash in found]
        return plan_upgrade(key, records, decisive) if records else None

    def earlier_keys(self, cache: TuneCache,
                     key: Key) -> list[tuple[Key, dict[str, str]]]:
        """``key`` under each older version's library fields (the newest first), with
        those fields."""
        out = []
        for env, libraries in self._earlier.older_envs(cache, key, LIBRARY_FIELDS):
            mapping = {**key.mapping, "env": env}
            out.append((Key.of(mapping, family=gemm_family(mapping)), libraries))
        return out
