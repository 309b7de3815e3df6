"""Moving entries between caches: export to versioned JSON lines, the export file read
back, and the checks of every incoming entry (nothing supplied trusted) that import and
merge (tunecache.ops.importing) apply."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any, Literal, TextIO

from .._version import __version__
from ..errors import ExportFormatError, InvalidEntryError
from ..keys import (
    MAX_KEY_BYTES,
    best_candidate,
    key_hash,
    key_labels,
    meta_to_json,
    storable,
    timings_to_json,
    validate_meta,
    validate_timings,
)
from ..store import ArtifactStore, Database, columns, engine, exchange_queries
from ..store.artifact_queries import GraphFilter
from ..store.artifact_rows import (
    MAX_PAYLOAD_BYTES,
    MAX_SIGNATURE_BYTES,
    MAX_TORCH_CHARS,
    validate_identity,
)
from ..store.entry_filter import EntryFilter
from .entries import PAGE, loads, noop, pages, stored_key

__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "GRAPHS_EXPORT_VERSION", "READABLE_VERSIONS",
           "CONFLICT_POLICIES", "ConflictPolicy", "IMPORT_BATCH", "SkippedEntry", "ExportReport",
           "ExportFile", "export", "parse_export", "Incoming", "IncomingGraph", "stored_entry",
           "validated_entry", "validated_graph", "graph_loads", "MAX_GRAPH_LOADS"]

EXPORT_FORMAT = "tunecache-export"
EXPORT_VERSION = 1
# A file that carries compiled graphs says version 2, so that a tunecache that predates
# them refuses it whole, by its header, instead of reporting every graph line as a bad
# entry; a file without graphs stays version 1, readable by every tunecache.
GRAPHS_EXPORT_VERSION = 2
READABLE_VERSIONS = (EXPORT_VERSION, GRAPHS_EXPORT_VERSION)
# A compiled graph is one line, {"graph": {...}} with its payload and signature in base64.
_GRAPH_LINE = '{"graph":'
_ENTRY_LINE_MAX = MAX_KEY_BYTES + 2 * 1024 * 1024
_GRAPH_LINE_MAX = 4 * (MAX_PAYLOAD_BYTES // 3 + 1) + 4 * MAX_SIGNATURE_BYTES + 64 * 1024
CONFLICT_POLICIES = ("keep", "replace", "faster")
ConflictPolicy = Literal["keep", "replace", "faster"]
# A graph's loads past this are no count (the column is 32-bit on PostgreSQL).
MAX_GRAPH_LOADS = 2**31 - 1
IMPORT_BATCH = 500  # also bounded by SQLite's bound-parameter limit (999 before 3.32)
# An export's lines are spooled until the header, which counts only what was written, is
# out: in memory up to this size, then in a temporary file.
_SPOOL_BYTES = 16 * 1024 * 1024
# The times of an entry an export line or a source database gives, kept by import/merge.
_TIMES = ("created_at", "updated_at", "last_used_at")


@dataclasses.dataclass(frozen=True)
class SkippedEntry:
    """A stored entry (or ``kind:key`` of a compiled graph) an export left behind, and why."""

    key_hash: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ExportReport:
    """What an export wrote: entries and compiled graphs, and what it left behind
    (``provenance_dropped``: entries written without their unreadable family or meta)."""

    database: str
    exported: int
    graphs: int
    skipped_invalid: tuple[SkippedEntry, ...]
    provenance_dropped: int
    best_only: bool


def _json_safe_timings(timings: Mapping[str, float]) -> dict[str, float | None]:
    return {k: (None if v == math.inf else v) for k, v in sorted(timings.items())}


def export(
    db: Database,
    out: TextIO,
    *,
    best_only: bool = False,
    env: EntryFilter | None = None,
    graphs: bool = True,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> ExportReport:
    """Write done entries as JSON lines: a header, then one entry per line, then (with
    ``graphs``, those ``env`` selects: see GraphFilter.of_entries) one compiled graph per
    line, its payload and signature in base64; unreadable graphs are skipped, reported.

    ``best_only`` keeps the winning candidate's timing and writes every other candidate
    as null ("not measured"): the file is smaller, a consumer still picks the same winner,
    and Inductor, which needs a timing for every choice, gets a full hit (unmeasured
    candidates count as infinitely slow) instead of benchmarking the missing ones.
    """
    progress = progress or noop
    total = int(db.run(lambda c: engine.scalar(c, exchange_queries.count_done(env))))
    store = ArtifactStore(db)
    where = GraphFilter.of_entries(env) if graphs else None
    n_graphs = store.count(where) if where is not None else 0
    if on_total:
        on_total(total + n_graphs)
    exported_at = time.time()
    # The header counts what is written, known only at the end: the lines are spooled and
    # the header goes out first all the same, so that the file still streams to a reader.
    with tempfile.SpooledTemporaryFile(_SPOOL_BYTES, "w+", encoding="utf-8") as body:
        report = _export_lines(db, body, store, where if n_graphs else None, best_only, env,
                               progress)
        header = {
            "format": EXPORT_FORMAT,
            "version": GRAPHS_EXPORT_VERSION if report.graphs else EXPORT_VERSION,
            "tunecache": __version__,
            "exported_at": exported_at,
            "source": db.display_url,
            "best_only": best_only,
            "entries": report.exported,
            "graphs": report.graphs,
        }
        out.write(json.dumps(header, sort_keys=True) + "\n")
        body.seek(0)
        shutil.copyfileobj(body, out)
    return report


def _export_lines(db: Database, out: IO[str], store: ArtifactStore, where: GraphFilter | None,
                  best_only: bool, env: EntryFilter | None,
                  progress: Callable[[int], None]) -> ExportReport:
    """The lines of :func:`export` after its header, and its report."""
    written = 0
    skipped: list[SkippedEntry] = []
    dropped = [0]
    for page in pages(db, lambda after: exchange_queries.select_done_page(env, after, PAGE)):
        for row in page:
            try:
                record = stored_entry(row, dropped)
                # Checked as an import checks it: what export writes, import takes.
                timings = validated_entry(row.key_hash, record).timings
            except ValueError as e:
                # A bad row is left behind (and reported), never shipped to other clusters.
                skipped.append(SkippedEntry(row.key_hash, str(e)))
                continue
            best = best_candidate(timings)
            if best_only:
                timings = {name: (ms if name == best else math.inf)
                           for name, ms in timings.items()}
            line = {**record, "timings": _json_safe_timings(timings), "best": best}
            out.write(json.dumps(line, sort_keys=True, separators=(",", ":"),
                                 allow_nan=False) + "\n")
            written += 1
        progress(len(page))
    graphs_written = 0
    for infos in store.infos(where) if where is not None else ():
        for info in infos:
            found = store.inspect(info.kind, info.key)
            if found is None:
                continue  # pruned since the page was read
            if isinstance(found, str):
                # Unreadable here is unreadable everywhere: left behind, reported.
                skipped.append(SkippedEntry(f"{info.kind}:{info.key}", found))
                continue
            line = {"graph": {
                "kind": found.kind, "key": found.key, "digest": found.digest,
                "signature": base64.b64encode(found.signature).decode("ascii"),
                "payload": base64.b64encode(found.payload).decode("ascii"),
                "torch": found.torch_version, "created_at": found.created_at,
                # Kept by import, so that an imported graph ages from its last use and
                # keeps its loads, as an entry does.
                "last_used_at": info.last_used_at, "hits": graph_loads(info.hits),
            }}
            out.write(json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n")
            graphs_written += 1
        progress(len(infos))
    return ExportReport(db.display_url, written, graphs_written, tuple(skipped), dropped[0],
                        best_only)


def graph_loads(hits: Any) -> int:
    """A graph's recorded loads as an export carries them: 0 for a count no job records."""
    count = columns.integer(hits)
    return count if count is not None and 0 <= count <= MAX_GRAPH_LOADS else 0


# -- import / merge ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Incoming:
    where: str
    key_hash: str
    key_json: str
    labels: dict[str, str | None]
    timings: dict[str, float]
    timings_json: str
    best: str
    tune_seconds: float | None
    times: dict[str, float | None]
    family: str | None = None
    meta_json: str | None = None


def stored_entry(row: Any, dropped: list[int]) -> dict[str, Any]:
    """A done row of :func:`exchange_queries.select_done_page` as an export line carries it (not yet
    validated as an import validates it); ValueError(reason) when its key or timings are
    unreadable. Its family and meta only inform: one that is unreadable (garbled, NaN in
    the meta, past its size) is left out and counted in ``dropped[0]``, the entry kept."""
    try:
        timings = validate_timings(row.timings_json, row.key_hash)
    except InvalidEntryError as e:
        raise ValueError(e.reason) from None
    record = {"key": stored_key(row.key_json), "key_hash": row.key_hash, "timings": timings,
              "tune_seconds": row.tune_seconds, **{name: getattr(row, name) for name in _TIMES}}
    family = columns.text(row.family)
    if family is not None and _family_error(family) is None:
        record["family"] = family
    meta = validate_meta(columns.text(row.meta_json))
    if meta:
        record["meta"] = meta
    if (row.has_family and "family" not in record) or (row.has_meta and "meta" not in record):
        dropped[0] += 1
    return record


# A family is the sha256 hex digest of a key's structure (inductor.transfer.gemm_family):
# neighbours are found by equal families, so any other text matches no key a job computes,
# and only this form is taken from an import file or another database.
_FAMILY = re.compile(r"[0-9a-f]{64}")


def _family_error(family: Any) -> str | None:
    """Why ``family`` is no family tunecache writes, or None."""
    if not isinstance(family, str) or _FAMILY.fullmatch(family) is None:
        return '"family" is not a sha256 hex digest (64 characters 0-9, a-f)'
    return None


def _provenance(record: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The entry's family and meta JSON as given (None where absent; files written
    before they existed have neither); ValueError(reason) when either is malformed."""
    family = record.get("family")
    if family is not None:
        why = _family_error(family)
        if why is not None:
            raise ValueError(why)
    meta = record.get("meta")
    if meta is None:
        return family, None
    if not isinstance(meta, dict):
        raise ValueError('"meta" is not a JSON object')
    try:
        meta_json = meta_to_json(meta)
    except (TypeError, ValueError, RecursionError):
        raise ValueError('"meta" is not a JSON object tunecache stores (too large, or '
                         'holding NUL or lone surrogates)') from None
    return family, meta_json


def _times(record: Mapping[str, Any],
           names: tuple[str, ...] = _TIMES) -> dict[str, float | None]:
    """The entry's (or graph's) created/updated/last-used times as given (None where
    absent), each a time no later than now: a time in the future would keep the entry
    from every `prune --older-than`."""
    now = time.time()
    times: dict[str, float | None] = {}
    for name in names:
        value = record.get(name)
        seconds = columns.time(value)
        if value is not None and (seconds is None or seconds < 0):
            raise ValueError(f'"{name}" is {value!r}, not a time (seconds since the epoch)')
        times[name] = None if seconds is None else min(seconds, now)
    return times


def validated_entry(where: str, record: Any) -> Incoming:
    """Check one imported entry; raise ValueError(reason). Nothing supplied is trusted:
    the hash is recomputed from the key, the winner from the timings."""
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    key = record.get("key")
    if not isinstance(key, dict):
        raise ValueError('"key" is missing or not a JSON object')
    try:
        h, key_json = key_hash(key)
    except (TypeError, ValueError) as e:
        raise ValueError(f"bad key: {e}") from None
    supplied = record.get("key_hash")
    if supplied is not None and supplied != h:
        raise ValueError(f'"key_hash" does not match the key (the key hashes to {h[:16]})')
    if "timings" not in record:
        raise ValueError('"timings" is missing')
    try:
        timings = validate_timings(record["timings"], h)
    except InvalidEntryError as e:
        raise ValueError(e.reason) from None
    tune_seconds = record.get("tune_seconds")
    seconds = columns.time(tune_seconds)
    if tune_seconds is not None and (seconds is None or seconds < 0):
        raise ValueError(f'"tune_seconds" is {tune_seconds!r}, not a non-negative number')
    # All-null timings are a result too ("no candidate runs here"); stored with an empty
    # winner, as the core publishes them.
    best = best_candidate(timings) or ""
    family, meta_json = _provenance(record)
    return Incoming(where, h, key_json, key_labels(key), timings, timings_to_json(timings),
                     best, seconds, _times(record), family, meta_json)


@dataclasses.dataclass(frozen=True)
class IncomingGraph:
    kind: str
    key: str
    payload: bytes
    signature: bytes
    torch_version: str
    # Kept from the source, as an entry's are (None: the import's time); loads by jobs.
    created_at: float | None = None
    last_used_at: float | None = None
    hits: int = 0


def _decoded(value: Any, name: str, limit: int) -> bytes:
    """Bytes given as base64 text (or as bytes, by merge), at most ``limit`` of them."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        if len(value) > 4 * (limit // 3 + 1):
            raise ValueError(f'"{name}" is over {limit} bytes')
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f'"{name}" is not base64') from None
    else:
        raise ValueError(f'"{name}" is missing or not base64 text')
    if len(data) > limit:
        raise ValueError(f'"{name}" is over {limit} bytes')
    return data


def validated_graph(record: Any) -> IncomingGraph:
    """Check one imported compiled graph; raise ValueError(reason). The digest is
    recomputed from the payload; the signature is kept for the readers to verify (the
    store never runs what it stores)."""
    if not isinstance(record, dict):
        raise ValueError('"graph" is not a JSON object')
    kind, key = record.get("kind"), record.get("key")
    why = validate_identity(kind, key)
    if why is not None:
        raise ValueError(why)
    assert isinstance(kind, str) and isinstance(key, str)  # validate_identity checked both
    torch = record.get("torch")
    if not storable(str(key)) or (isinstance(torch, str) and not storable(torch)):
        raise ValueError('"key" or "torch" holds a NUL character or a lone surrogate')
    signature = _decoded(record.get("signature"), "signature", MAX_SIGNATURE_BYTES)
    if not signature:
        raise ValueError('"signature" is empty')
    payload = _decoded(record.get("payload"), "payload", MAX_PAYLOAD_BYTES)
    digest = record.get("digest")
    if digest is not None and digest != hashlib.sha256(payload).hexdigest():
        raise ValueError('"digest" does not match the payload')
    torch_version = record.get("torch")
    if not isinstance(torch_version, str) or len(torch_version) > MAX_TORCH_CHARS:
        raise ValueError(f'"torch" is not a string of at most {MAX_TORCH_CHARS} characters')
    hits = record.get("hits", 0)
    if hits is None:
        hits = 0
    if columns.integer(hits) is None or not 0 <= hits <= MAX_GRAPH_LOADS:
        raise ValueError(f'"hits" is {columns.clip(hits)}, not a count of loads')
    times = _times(record, ("created_at", "last_used_at"))
    return IncomingGraph(kind, key, payload, signature, torch_version,
                         times["created_at"], times["last_used_at"], hits)


class ExportFile:
    """The entry lines of an export file, (where, record or ValueError) each, read as
    iterated. The header is read when this is made: a file that does not start with one
    is refused whole (:class:`ExportFormatError`); a bad entry line only costs that line.

    ``expected``: the lines after the header that the header counts (entries and graphs),
    None where it says no count; ``read``: the lines after it read so far. A file with
    fewer lines than its header counts was cut short (a copy that stopped, a full disk).
    """

    def __init__(self, lines: Iterable[str], source: str = "input") -> None:
        self._it = iter(lines)
        self.number = 0
        self.read = 0
        header: Any = None
        seen = False  # a line that is not blank
        for raw in self._it:
            self.number += 1
            if raw.strip():
                seen = True
                try:
                    header = loads(raw, _ENTRY_LINE_MAX)
                except ValueError:
                    header = None
                break
        if not isinstance(header, dict) or header.get("format") != EXPORT_FORMAT:
            what = (f"line {self.number} is not a tunecache export header" if seen
                    else "the file is empty, not a tunecache export")
            raise ExportFormatError(source, what, EXPORT_FORMAT, EXPORT_VERSION)
        if header.get("version") not in READABLE_VERSIONS:
            raise ExportFormatError(
                source, f"export format version {header.get('version')!r} is not supported "
                f"(this tunecache reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}; upgrade tunecache)",
                EXPORT_FORMAT, EXPORT_VERSION)
        counts = [header.get("entries"), header.get("graphs", 0)]
        self.expected: int | None = (
            sum(counts) if all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                               for n in counts) else None)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for raw in self._it:
            self.number += 1
            if not raw.strip():
                continue
            self.read += 1
            where = f"line {self.number}"
            if len(raw) > (_GRAPH_LINE_MAX if raw.startswith(_GRAPH_LINE) else _ENTRY_LINE_MAX):
                yield where, ValueError("line too long")
                continue
            try:
                record = loads(raw, len(raw))
            except ValueError as e:
                record = ValueError(f"not JSON ({e})")
            yield where, record

    def cut_short(self) -> bool:
        """Whether the file, read to its end, holds fewer lines than its header counts."""
        return self.expected is not None and self.read < self.expected


def parse_export(lines: Iterable[str], source: str = "input") -> ExportFile:
    """The :class:`ExportFile` of ``lines`` (its header read: ExportFormatError if it has
    none)."""
    return ExportFile(lines, source)
