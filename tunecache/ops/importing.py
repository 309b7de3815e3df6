"""Import and merge: the entries (and compiled graphs) of an export file or of another
database written into this one, each validated (tunecache.ops.exchange), under a conflict
policy, in batches; and the report of one."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from sqlalchemy import Connection

from ..errors import ConfigError, InvalidEntryError
from ..keys import validate_timings
from ..store import ArtifactStore, Database, engine, exchange_queries
from ..store.claims import lease_passed
from .entries import PAGE, noop, pages
from .exchange import (
    CONFLICT_POLICIES,
    IMPORT_BATCH,
    ConflictPolicy,
    ExportFile,
    Incoming,
    graph_loads,
    stored_entry,
    validated_entry,
    validated_graph,
)
from .opening import refuse_readonly

__all__ = ["GraphCounts", "BadRecord", "LineCounts", "ImportReport", "import_records",
           "import_file", "merge"]


@dataclasses.dataclass(frozen=True)
class GraphCounts:
    """The compiled graphs of an import: stored, and already there (first publish wins)."""

    new: int = 0
    kept: int = 0


@dataclasses.dataclass(frozen=True)
class BadRecord:
    """A line or source entry an import skipped, and why."""

    where: str
    reason: str


@dataclasses.dataclass(frozen=True)
class LineCounts:
    """The lines after an export file's header: read, and counted by the header (None
    where it says no count)."""

    read: int
    header: int | None


@dataclasses.dataclass(frozen=True)
class ImportReport:
    """What an import or a merge did (``dry_run``: would do). ``interrupted``: Ctrl-C
    stopped it, committed up to ``done_through`` (a line or entry; None: nothing yet).
    ``lines`` and ``cut_short`` are an import file's; ``source`` and
    ``provenance_dropped`` a merge's (None where the report is not theirs)."""

    database: str
    on_conflict: str
    dry_run: bool
    new: int
    replaced: int
    kept: int
    busy: int
    graphs: GraphCounts
    bad: tuple[BadRecord, ...]
    interrupted: bool
    done_through: str | None
    lines: LineCounts | None = None
    cut_short: bool = False
    source: str | None = None
    provenance_dropped: int = 0
    # Of ``kept``: done entries with full timings that the file's winner-only ones (a
    # --best-only export's) would have replaced under replace or faster.
    kept_full: int = 0

    @property
    def invalid(self) -> int:
        return len(self.bad)

    def to_json(self) -> dict[str, Any]:
        """The --json document: each field, and ``invalid``; an import file's and a
        merge's own fields only in theirs."""
        data = {**dataclasses.asdict(self), "invalid": self.invalid}
        if self.lines is None:
            del data["lines"], data["cut_short"]
        if self.source is None:
            del data["source"], data["provenance_dropped"]
        return data


def _fastest(timings: Mapping[str, float]) -> float:
    return min((ms for ms in timings.values() if math.isfinite(ms)), default=math.inf)


class _Import:
    """One import into ``db``: its counts, bad records and keys seen so far, and the batch
    of valid entries not yet written (written IMPORT_BATCH at a time, each batch one
    transaction)."""

    def __init__(self, db: Database, on_conflict: ConflictPolicy, dry_run: bool,
                 progress: Callable[[int], None]) -> None:
        self.db, self.on_conflict, self.dry_run, self.progress = (db, on_conflict, dry_run,
                                                                  progress)
        self.owner = f"import:{socket.gethostname()[:200]}:{os.getpid()}"
        self.counts: Counter[str] = Counter(new=0, replaced=0, kept=0, busy=0)
        self.graphs: Counter[str] = Counter(new=0, kept=0)
        self.bad: list[BadRecord] = []
        self.seen: set[str] = set()
        self.seen_graphs: set[tuple[str, str]] = set()
        self.store = ArtifactStore(db)
        self.batch: list[Incoming] = []

    def run(self, records: Iterable[tuple[str, Any]],
            stop: Callable[[], bool] | None) -> tuple[bool, str | None]:
        """Take every record (stopping, between batches, once ``stop`` says so): whether
        it was interrupted, and the last record whose outcome is committed."""
        done_through: str | None = None
        last: str | None = None
        for where, record in records:
            if not self.batch:
                done_through = last
                if stop is not None and stop():
                    return True, done_through
            last = where
            self.take(where, record)
        self.flush()
        return False, last

    def take(self, where: str, record: Any) -> None:
        """One record: a bad one noted, a graph stored, an entry batched."""
        try:
            if isinstance(record, ValueError):
                raise record  # a line that did not read: bad like an invalid entry
            if isinstance(record, dict) and "graph" in record:
                self.add_graph(record["graph"])
                self.progress(1)
                return
            inc = validated_entry(where, record)
        except ValueError as e:
            self.bad.append(BadRecord(where, str(e)))
            self.progress(1)
            return
        if inc.key_hash in self.seen:
            # Two entries of one key in one file: the first wins, like `keep` would.
            self.counts["kept"] += 1
            self.progress(1)
            return
        self.seen.add(inc.key_hash)
        self.batch.append(inc)
        if len(self.batch) >= IMPORT_BATCH:
            self.flush()

    def add_graph(self, record: Any) -> None:
        """First publish wins, as for the jobs: a graph already there stays (under every
        --on-conflict policy: a graph's bytes are checked by its signature, not ranked)."""
        g = validated_graph(record)
        if (g.kind, g.key) in self.seen_graphs:
            self.graphs["kept"] += 1
            return
        self.seen_graphs.add((g.kind, g.key))
        if self.dry_run:
            new = not self.store.exists(g.kind, g.key)
        else:
            new = self.store.put(g.kind, g.key, g.payload, g.signature, g.torch_version,
                                 created_at=g.created_at, last_used_at=g.last_used_at,
                                 hits=g.hits)
        self.graphs["new" if new else "kept"] += 1

    def flush(self) -> None:
        """Write the batch, one transaction, and count its outcomes."""
        if not self.batch:
            return
        self.counts.update(self.db.run(self._write, write=True))
        self.progress(len(self.batch))
        self.batch = []

    def _write(self, conn: Connection) -> Counter[str]:
        """The batch's outcomes, written (a transaction that may be retried whole: it
        counts only what it returns)."""
        got: Counter[str] = Counter()
        existing = exchange_queries.existing_for_import(conn, [i.key_hash for i in self.batch])
        inserts: list[exchange_queries.ImportedEntry] = []
        overwrites: list[tuple[exchange_queries.ImportedEntry, Any]] = []
        for inc in self.batch:
            entry = exchange_queries.ImportedEntry(inc.key_hash, inc.key_json, inc.labels,
                                                   inc.timings_json, inc.best,
                                                   inc.tune_seconds, inc.times, inc.family,
                                                   inc.meta_json)
            row = existing.get(inc.key_hash)
            if row is None:
                inserts.append(entry)
                continue
            outcome = self._against(inc, row)
            if outcome == "overwrite":
                overwrites.append((entry, row))
            elif outcome == "kept_full":
                got["kept"] += 1
                got["kept_full"] += 1
            else:
                got[outcome] += 1
        if self.dry_run:
            got["new"] += len(inserts)
            got["replaced"] += len(overwrites)
            return got
        if inserts:
            done = exchange_queries.insert_done_rows(conn, self.owner, inserts)
            got["new"] += done
            got["busy"] += len(inserts) - done  # claimed by a job meanwhile (PG)
        for entry, row in overwrites:
            if exchange_queries.overwrite_done(conn, entry, token=row.token, state=row.state,
                                               owner=self.owner):
                got["replaced"] += 1
            else:
                got["busy"] += 1
        return got

    def _against(self, inc: Incoming, row: Any) -> str:
        """What the policy does with ``inc`` where the target holds ``row``: "busy",
        "kept", "kept_full" (kept: see below) or "overwrite"."""
        if row.state == "claimed" and not lease_passed(row.lease_expires_at, row.now):
            return "busy"
        if row.state == "done":
            if self.on_conflict == "keep" or row.timings_json == inc.timings_json:
                return "kept"
            try:
                stored = validate_timings(row.timings_json, row.key_hash)
            except InvalidEntryError:
                stored = {}  # an invalid stored entry loses to any result
            # Full timings are never lost to fewer: a --best-only file's entry (the
            # winner's timing, the others unmeasured) would leave later jobs nothing to
            # rank the other candidates by, and `warm --exhaustive` nothing to compare.
            if any(math.isfinite(ms) and c in inc.timings and not math.isfinite(inc.timings[c])
                   for c, ms in stored.items()):
                return "kept_full"
            if self.on_conflict == "faster" and not _fastest(inc.timings) < _fastest(stored):
                return "kept"
        return "overwrite"

    def report(self, interrupted: bool, done_through: str | None) -> ImportReport:
        return ImportReport(
            self.db.display_url, self.on_conflict, self.dry_run, self.counts["new"],
            self.counts["replaced"], self.counts["kept"], self.counts["busy"],
            GraphCounts(self.graphs["new"], self.graphs["kept"]), tuple(self.bad),
            interrupted, done_through, kept_full=self.counts["kept_full"])


def import_records(
    db: Database,
    records: Iterable[tuple[str, Any]],
    *,
    on_conflict: ConflictPolicy = "keep",
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> ImportReport:
    """Validate and write entries; see :data:`CONFLICT_POLICIES` and the CLI's help.

    ``stop`` is asked whenever everything read so far is committed (the CLI's Ctrl-C):
    once it says True, the import ends there and the report says ``interrupted``, with
    ``done_through``, the last record (line or entry) whose outcome is committed. Running
    the same import again finishes it: what is in already is left as it is (kept).

    For a key already in the target:

    - done: ``keep`` leaves it as it is (a done entry is immutable); ``replace`` overwrites
      it; ``faster`` overwrites it only if the incoming fastest timing is lower; neither
      overwrites a timing with an unmeasured one (a --best-only file's entry over a full
      one): that entry is kept, and counted in ``kept_full``;
    - claimed and its lease running: left alone under every policy (someone is tuning it;
      reported as busy);
    - failed, or a claim whose lease has passed: replaced by the done entry under every
      policy (a result beats no result; the old owner's late publish is fenced out).
    """
    if on_conflict not in CONFLICT_POLICIES:
        raise ConfigError("--on-conflict", on_conflict, " or ".join(CONFLICT_POLICIES))
    if not dry_run:
        refuse_readonly(db, "import")
    state = _Import(db, on_conflict, dry_run, progress or noop)
    return state.report(*state.run(records, stop))


def import_file(db: Database, export: ExportFile, **options: Any) -> ImportReport:
    """:func:`import_records` of an export file; the report says, with ``cut_short``,
    whether the file held fewer lines than its header counts (``lines``: read, and
    counted by the header), the lines present imported all the same."""
    report = import_records(db, export, **options)
    return dataclasses.replace(report, lines=LineCounts(export.read, export.expected),
                               cut_short=not report.interrupted and export.cut_short())


def _source_records(src: Database, dropped: list[int]) -> Iterator[tuple[str, Any]]:
    for page in pages(src, lambda after: exchange_queries.select_done_page(None, after, PAGE)):
        for row in page:
            try:
                yield f"entry {row.key_hash[:16]}", stored_entry(row, dropped)
            except ValueError as e:
                yield f"entry {row.key_hash[:16]}", e
    store = ArtifactStore(src)
    for infos in store.infos():
        for info in infos:
            where = f"graph {info.kind} {info.key[:40]}"
            found = store.inspect(info.kind, info.key)
            if found is None:
                continue
            if isinstance(found, str):
                yield where, ValueError(found)
                continue
            yield where, {"graph": {"kind": found.kind, "key": found.key,
                                    "payload": found.payload, "signature": found.signature,
                                    "torch": found.torch_version,
                                    "created_at": found.created_at,
                                    "last_used_at": info.last_used_at,
                                    "hits": graph_loads(info.hits)}}


def merge(
    src: Database,
    into: Database,
    *,
    on_conflict: ConflictPolicy = "keep",
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> ImportReport:
    """Import every done entry of ``src`` into ``into`` (validated like an import file;
    ``stop`` as for :func:`import_records`)."""
    if src.url == into.url:
        raise ConfigError("SRC_DB", src.display_url, "a database other than the target")
    if not dry_run:
        refuse_readonly(into, "merge")
    if on_total:
        on_total(int(src.run(lambda c: engine.scalar(c, exchange_queries.count_done(None)))))
    dropped = [0]
    report = import_records(into, _source_records(src, dropped), on_conflict=on_conflict,
                            dry_run=dry_run, progress=progress, stop=stop)
    return dataclasses.replace(report, source=src.display_url, provenance_dropped=dropped[0])
