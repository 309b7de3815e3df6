"""Fixtures: a fresh SQLite file per test, and a fresh database on the real PostgreSQL server.

PostgreSQL is not optional: `.ci/run` starts it. Point TUNECACHE_TEST_PG at another server
(a libpq URL of a database whose user may CREATE DATABASE) to test against it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

PG_ADMIN_URL = os.environ.get("TUNECACHE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _admin_connect():
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tune.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    name = f"tunecache_test_{uuid.uuid4().hex[:12]}"
    with _admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with _admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Run the test once on a SQLite file and once on PostgreSQL."""
    return request.getfixturevalue(f"{'sqlite' if request.param == 'sqlite' else 'pg'}_url")
