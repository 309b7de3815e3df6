"""What an entry's tuning bought, as typed columns computed once when the entry is written.

`tunecache stats` reports, per kind and op, the untuned choice's time against the tuned
winner's and how transferred entries did. Those inputs are in the meta object (and, for a
GEMM entry tuned before meta existed, in its timings); parsing them on every `stats` cost
most of its time (about 2 s per 100,000 entries). So each writer of a done entry (publish,
import, merge, a meta update such as `warm --exhaustive`'s, migration 0007 for older rows)
stores them here, and stats sums them in SQL.

``gain_state`` says what the other columns hold: NULL, not computed (a writer that did not
set them: stats reads that row's JSON itself); 1, computed; 2, the meta or timings did not
read (stats counts the row as skipped and sums nothing of it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import ColumnElement, bindparam, case, cast, select

from .. import stored_json
from ..keys import MAX_META_BYTES, MAX_TIMINGS_BYTES
from . import columns
from .schema import entries

__all__ = ["Gain", "COLUMNS", "COMPUTED", "UNREADABLE", "MAX_COUNT", "compute", "values",
           "params", "assignments", "publish_params", "publish_assignments", "SOURCE"]

COMPUTED = 1
UNREADABLE = 2
# A candidate count past this is no count (stats' SUM must not overflow a 64-bit integer;
# PostgreSQL's integer is 32 bits).
MAX_COUNT = 2**31 - 1
COLUMNS = ("gain_state", "gain_baseline_ms", "gain_best_ms", "transfer_benchmarked",
           "transfer_generated", "transfer_regret")


@dataclasses.dataclass(frozen=True)
class Gain:
    """One entry's gain inputs. ``baseline_ms``/``best_ms``: None without a usable one;
    ``benchmarked``/``generated``: None when the entry was not transferred."""

    readable: bool = True
    baseline_ms: float | None = None
    best_ms: float | None = None
    candidate: str | None = None  # the baseline's candidate name
    source: str = "meta"  # where the times came from: "meta" or "timings"
    benchmarked: int | None = None
    generated: int | None = None
    regret: float | None = None


def _ms(value: Any) -> float | None:
    """A time in ms: a finite positive number within stored_json's bound, else None."""
    number = stored_json.number(value)
    return number if number is not None and number > 0 else None


def _count(value: Any) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
    return value if ok else 0


def _from_timings(timings: Any) -> tuple[float | None, float | None, str | None]:
    """A GEMM's (baseline ms, best ms, baseline candidate) from its timings: the fastest
    extern (ATen) candidate, the choice Inductor makes without tuning, and the fastest of
    all. Lighter than keys.validate_timings (nothing here is stored or run: a name is only
    compared, and printed escaped)."""
    best = baseline = None
    name = None
    for candidate, value in timings.items():
        ms = _ms(value)
        if ms is None:
            continue
        if best is None or ms < best:
            best = ms
        if candidate.startswith("extern:") and (baseline is None or ms < baseline):
            baseline, name = ms, candidate
    return baseline, best, name


def _object(text: Any, limit: int) -> dict[str, Any] | None:
    """A stored JSON object, or None for anything else (not text, not JSON, not read)."""
    try:
        value = stored_json.loads(text, limit)
    except stored_json.StoredJSONError:
        return None
    return value if isinstance(value, dict) else None


def compute(kind: Any, timings_json: Any, meta_json: Any) -> Gain:
    """The gain inputs of one entry from its stored texts (read through stored_json);
    ``readable`` False when its meta, or a GEMM's timings where they are needed, do not
    read as a JSON object."""
    meta = {} if meta_json is None else _object(meta_json, MAX_META_BYTES)
    if meta is None:
        return Gain(readable=False)
    given = meta.get("baseline")
    baseline = _ms(given.get("ms")) if isinstance(given, dict) else None
    candidate = given.get("candidate") if isinstance(given, dict) else None
    best = _ms(meta.get("best_ms"))
    source = "meta"
    if kind == "gemm" and (baseline is None or best is None):
        # Entries tuned before meta existed: both times are in the timings.
        timings = _object(timings_json, MAX_TIMINGS_BYTES)
        if timings is None:
            return Gain(readable=False)
        t_base, t_best, t_name = _from_timings(timings)
        if baseline is None:
            baseline, candidate = t_base, t_name
        best = best if best is not None else t_best
        source = "timings"
    if baseline is None or best is None:
        baseline = best = None
    named = candidate if isinstance(candidate, str) else None
    moved = meta.get("transfer")
    if not isinstance(moved, dict):
        return Gain(baseline_ms=baseline, best_ms=best, candidate=named, source=source)
    return Gain(baseline_ms=baseline, best_ms=best, candidate=named, source=source,
                benchmarked=_count(moved.get("benchmarked")),
                generated=_count(moved.get("generated")), regret=_ms(meta.get("regret")))


def values(kind: Any, timings_json: Any, meta_json: Any) -> dict[str, Any]:
    """The gain columns of an entry, by column name."""
    gain = compute(kind, timings_json, meta_json)
    return {"gain_state": COMPUTED if gain.readable else UNREADABLE,
            "gain_baseline_ms": gain.baseline_ms, "gain_best_ms": gain.best_ms,
            "transfer_benchmarked": gain.benchmarked, "transfer_generated": gain.generated,
            "transfer_regret": gain.regret}


def params(kind: Any, timings_json: Any, meta_json: Any) -> dict[str, Any]:
    """:func:`values` as the bind parameters of :func:`assignments`."""
    return {f"p_{k}": v for k, v in values(kind, timings_json, meta_json).items()}


def assignments() -> dict[str, Any]:
    """The gain columns' values in an INSERT or UPDATE whose writer knows the kind."""
    return {c: bindparam(f"p_{c}", type_=entries.c[c].type) for c in COLUMNS}


# What a writer that has only the meta (a meta update) reads of the row: its kind, and the
# timings a GEMM's baseline may come from, NULL past the size a reader takes.
SOURCE = (
    select(entries.c.kind, columns.bounded(entries.c.timings_json, MAX_TIMINGS_BYTES))
    .where(entries.c.key_hash == bindparam("p_key_hash"))
)


def publish_params(timings_json: Any, meta_json: Any) -> dict[str, Any]:
    """Parameters of :func:`publish_assignments`: a publish knows its key hash, not its
    kind, so both readings are sent and the row's kind picks one."""
    return {**params("gemm", timings_json, meta_json),
            **{f"p_other_{k}": v for k, v in values(None, timings_json, meta_json).items()}}


def publish_assignments() -> dict[str, ColumnElement[Any]]:
    """The gain columns in an UPDATE of a row whose kind is in the row."""
    # Cast: PostgreSQL takes an untyped parameter of a CASE for text.
    return {c: case((entries.c.kind == "gemm", cast(bindparam(f"p_{c}"), entries.c[c].type)),
                    else_=cast(bindparam(f"p_other_{c}"), entries.c[c].type))
            for c in COLUMNS}
