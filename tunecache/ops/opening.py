"""Opening the database for an operator command: at the head schema, in the mode asked.

A typo in --db must not create an empty database (and report an empty cache), and a
readonly process must refuse a write up front, in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from ..errors import ReadonlyModeError, SourceNotFoundError, StoreUnavailableError
from ..settings import Settings
from ..store import Database, ensure_schema
from ..store.migrate import current_revision

__all__ = ["open_database", "opened", "open_source", "refuse_readonly", "UpgradeReport", "upgrade"]


def open_database(settings: Settings, *, create: bool = False,
                  writes: str | None = None, read_only: bool = False) -> Database:
    """A :class:`Database` at the head schema (migrating when the mode allows it).

    ``create=False`` refuses a SQLite path that does not exist, instead of creating an
    empty database there, because a typo in --db would otherwise report an empty cache.
    ``create=True`` creates the file, but never its directory: a mistyped directory
    would otherwise be created and filled silently (and `stats` on the intended path
    would then find nothing). Only tunecache's own default directory is created.

    ``read_only``: the command only reads (stats, ls, show, export, dry runs). The
    database is opened read-only and is never created or migrated: a missing one is an
    error, and an empty file or an old schema says to run `tunecache upgrade`.

    In readonly mode the connection itself refuses writes, as a job's does; ``writes``
    names what the caller is about to write, refused up front in one line.
    """
    readonly = read_only or settings.mode == "readonly"
    db = Database(settings.db_url, settings.lock_seconds, readonly=readonly,
                  own_directory=settings.owns_directory)
    if writes and settings.mode == "readonly":
        raise ReadonlyModeError(db.display_url, writes)
    path = db.sqlite_path
    # A missing directory first, in a job's words (a missing file in it is then no
    # wonder); tunecache's own default directory is made by the first job.
    problem = db.sqlite_path_problem("--db")  # a directory; a missing directory
    if problem is not None and not settings.owns_directory:
        raise StoreUnavailableError(db.display_url, problem)
    if path and not os.path.exists(path) and (read_only or not create):
        raise StoreUnavailableError(
            db.display_url,
            "no database file there, and a dry run creates nothing; run it without "
            "--dry-run to create it, or check --db or TUNECACHE_DB" if read_only and create
            else "no database file there (nothing recorded yet?); check --db or TUNECACHE_DB",
        )
    problem = db.sqlite_path_problem("--db")  # a directory; a missing directory
    if problem is not None:
        raise StoreUnavailableError(db.display_url, problem)
    ensure_schema(db, may_migrate=not readonly)
    return db


def refuse_readonly(db: Database, action: str) -> None:
    """Raise ReadonlyModeError if ``db`` was opened readonly and ``action`` writes."""
    if db.readonly:
        raise ReadonlyModeError(db.display_url, action)


@contextlib.contextmanager
def opened(settings: Settings, *, create: bool = False, writes: str | None = None,
           read_only: bool = False) -> Iterator[Database]:
    """:func:`open_database`, disposed of when the block ends."""
    db = open_database(settings, create=create, writes=writes, read_only=read_only)
    try:
        yield db
    finally:
        db.dispose()


@contextlib.contextmanager
def open_source(settings: Settings, name: str = "SRC_DB") -> Iterator[Database]:
    """A database to read from (merge's ``name``): read-only, never created or migrated
    (it must be at this tunecache's schema), disposed of when the block ends."""
    db = Database(settings.db_url, settings.lock_seconds, readonly=True)
    try:
        if db.sqlite_path and not os.path.exists(db.sqlite_path):
            raise SourceNotFoundError(name, db.display_url)
        ensure_schema(db, may_migrate=False)
        yield db
    finally:
        db.dispose()


@dataclasses.dataclass(frozen=True)
class UpgradeReport:
    """The schema revision a database was at (None: a new database) and is at now."""

    database: str
    from_revision: str | None
    to_revision: str | None

    def to_json(self) -> dict[str, Any]:
        return {"database": self.database, "from": self.from_revision,
                "to": self.to_revision}


def upgrade(settings: Settings) -> UpgradeReport:
    """Run the migrations now (`tunecache upgrade`)."""
    db = Database(settings.db_url, settings.lock_seconds,
                  own_directory=settings.owns_directory)
    if settings.mode == "readonly":
        raise ReadonlyModeError(db.display_url, "upgrade")
    problem = db.sqlite_path_problem("--db")
    if problem is not None:
        raise StoreUnavailableError(db.display_url, problem)
    try:
        before = db.run(current_revision)
        ensure_schema(db, may_migrate=True)
        return UpgradeReport(db.display_url, before, db.run(current_revision))
    finally:
        db.dispose()
