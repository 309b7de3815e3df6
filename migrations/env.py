"""Alembic environment for tunecache.

tunecache runs migrations itself (tunecache.store.migrate), inside a transaction it has
already opened under the database's own lock, and hands that connection over here. Running
``alembic`` by hand also works: it needs ``-x url=...`` or TUNECACHE_DB.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from tunecache.settings import Settings
from tunecache.store.schema import metadata

config = context.config


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        version_table="tunecache_alembic_version",
    )


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or Settings.from_env().db_url
    engine = create_engine(url)
    with engine.begin() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("tunecache migrations run online only")
run_migrations_online()
