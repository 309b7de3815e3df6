"""Read-only probes of a database for `tunecache doctor`: they never write to it.

SQLite is read through a connection of its own, opened read-only: the engine's connect
hook (tunecache.store.engine) sets journal_mode, which would convert a WAL database.
PostgreSQL is only read, through a :class:`Database`.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from .claims import db_now
from .engine import Database
from .migrate import current_revision

__all__ = ["SQLITE_VERSION", "sqlite_path_of", "sqlite_look", "pg_server_version",
           "pg_login", "server_time"]

SQLITE_VERSION = sqlite3.sqlite_version


def sqlite_path_of(url: str) -> str:
    """The file a sqlite:/// URL names ("" for an in-memory one)."""
    return make_url(url).database or ""


def _sqlite_ro_engine(path: str) -> Any:
    uri = f"file:{path}?mode=ro"
    return create_engine("sqlite://", poolclass=NullPool,
                         creator=lambda: sqlite3.connect(uri, uri=True, timeout=5))


def sqlite_look(path: str) -> tuple[str | None, str]:
    """(schema revision, journal mode in the file) of the SQLite database at ``path``,
    read-only; raises whatever the driver raises when it is not a readable database."""
    engine = _sqlite_ro_engine(path)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT count(*) FROM sqlite_master")).scalar_one()
            revision = current_revision(conn)
            journal = str(conn.execute(text("PRAGMA journal_mode")).scalar_one())
        return revision, journal
    finally:
        engine.dispose()


def pg_server_version(db: Database) -> str:
    return str(db.run(lambda c: c.execute(text("SHOW server_version")).scalar_one()))


_LOGIN = text("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")


def pg_login(db: Database) -> tuple[str, bool]:
    """(the role this connection logged in as, whether it is a superuser)."""
    row = db.run(lambda c: c.execute(_LOGIN).one())
    return str(row[0]), bool(row[1])


def server_time(db: Database) -> float:
    """The database server's clock (the one leases are stamped with), in epoch seconds."""
    return float(db.run(lambda c: c.execute(select(db_now())).scalar_one()))
