"""Schema migrations: Alembic, configured in code, run by exactly one of many processes.

Many ranks open an empty database at the same moment. The first to take the database's own
write lock (BEGIN IMMEDIATE on SQLite; a transaction-scoped advisory lock on PostgreSQL)
upgrades inside that transaction; both engines have transactional DDL, so the others, once
they get the lock, see the head revision and do nothing. No side lock file is needed, which
matters on network filesystems where flock() may not reach other hosts.

The Alembic revision is the only schema version (no constant beside it).
"""

from __future__ import annotations

import importlib.util
import logging
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, inspect, text

from ..errors import SchemaOutOfDateError, SchemaTooNewError
from .engine import Database

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = ["ensure_schema", "current_revision", "head_revision", "known_revisions", "VERSION_TABLE"]

logger = logging.getLogger("tunecache")

VERSION_TABLE = "tunecache_alembic_version"
# Any constant will do; it only has to be the same in every tunecache.
_PG_MIGRATION_LOCK = 0x74756E65
# A script's own assignments, as Alembic's template writes them (migrations/script.py.mako).
_ASSIGNMENT = re.compile(r"^(revision|down_revision)\s*(?::[^=]*)?=\s*(?:[\"']([^\"']+)[\"']|None)",
                         re.MULTILINE)


def _script_location() -> str:
    # Installed (wheel or editable): migrations/ is the package tunecache._migrations.
    # Run from a source tree on PYTHONPATH without installing (as on the GPU machines):
    # it is the migrations/ folder beside the package, first even where another tree is
    # installed editable, whose migrations would not match this tree's schema.
    tree = Path(__file__).resolve().parents[2]
    if (tree / "pyproject.toml").is_file() and (tree / "migrations" / "versions").is_dir():
        return str(tree / "migrations")
    spec = importlib.util.find_spec("tunecache._migrations")
    if spec is not None and spec.submodule_search_locations:
        return next(iter(spec.submodule_search_locations))
    return str(Path(__file__).resolve().parents[2] / "migrations")


def _config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    return cfg


@lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


@lru_cache(maxsize=1)
def _linear_head() -> str | None:
    """The head of a linear history, read from the scripts without importing Alembic.

    Importing Alembic costs about as much as the rest of a CLI command's start, and every
    open only compares the database's revision with the head. Anything
    but one unbranched chain returns None, and Alembic decides.
    """
    parents: dict[str, str | None] = {}
    for script in Path(_script_location(), "versions").glob("*.py"):
        found = dict((m[1], m[2] or None) for m in _ASSIGNMENT.finditer(script.read_text()))
        if "revision" in found and found["revision"] is not None:
            parents[found["revision"]] = found.get("down_revision")
    heads = set(parents) - set(parents.values())
    return heads.pop() if len(heads) == 1 else None


def head_revision() -> str:
    head = _linear_head() or _scripts().get_current_head()
    assert head is not None, "tunecache ships at least one migration"
    return head


def known_revisions() -> set[str]:
    return {rev.revision for rev in _scripts().walk_revisions()}


def current_revision(conn: Connection) -> str | None:
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) == 1:
        return str(rows[0])
    from alembic.runtime.migration import MigrationContext

    # None, or several heads (a branched history): Alembic's own answer, or its error.
    revision: Any = MigrationContext.configure(
        conn, opts={"version_table": VERSION_TABLE}
    ).get_current_revision()
    return revision


def _check(url: str, revision: str | None) -> bool:
    """True when the schema is at head; raise if it is from a newer tunecache."""
    if revision == head_revision():
        return True
    if revision is not None and revision not in known_revisions():
        raise SchemaTooNewError(url, revision)
    return False


def ensure_schema(db: Database, *, may_migrate: bool = True) -> bool:
    """Bring the database to the head revision, or refuse it. True if this call migrated.

    Raises :class:`SchemaTooNewError` for a database written by a newer tunecache, and
    :class:`SchemaOutOfDateError` when it needs a migration that ``may_migrate`` forbids.
    """
    if _check(db.display_url, db.run(current_revision)):
        return False
    if not may_migrate:
        raise SchemaOutOfDateError(db.display_url, db.run(current_revision))

    def upgrade(conn: Connection) -> bool:
        if db.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        revision = current_revision(conn)
        if _check(db.display_url, revision):
            return False
        logger.info("tunecache: migrating %s from %s to %s", db.display_url, revision,
                    head_revision())
        from alembic import command

        cfg = _config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
        return True

    return db.run(upgrade, write=True)
