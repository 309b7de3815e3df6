"""Readers of untrusted columns: every value read back from the shared database goes
through one of these before it is used.

SQLite keeps whatever a writer put in a column (text in a REAL column, a blob in an
INTEGER one), PostgreSQL's floats hold NaN and infinities, and a shared file may have been
written by anything. A reader returns the value when it is of the column's kind and None
(or a harmless stand-in) when it is not, so a hostile row costs only itself.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import ColumnElement, case, literal_column, null
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import Integer

from .. import stored_json

__all__ = ["text", "integer", "time", "total", "binary", "clip", "bounded"]


def text(value: Any, limit: int | None = None) -> str | None:
    """A string (of at most ``limit`` characters, when given), or None."""
    if not isinstance(value, str) or (limit is not None and len(value) > limit):
        return None
    return value


def integer(value: Any) -> int | None:
    """A whole number (a bool is none), or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def time(value: Any) -> float | None:
    """A finite number (seconds) within stored_json.MAX_NUMBER, or None: SQLite keeps an
    integer of any size a writer put in a REAL column's place."""
    return stored_json.number(value)


def total(value: Any) -> int:
    """A SUM read back: PostgreSQL's sum of bigint is numeric (a Decimal); SQLite's is
    whatever the column held (text in a hostile row sums as 0)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0
    return int(number) if math.isfinite(number) else 0


def binary(value: Any) -> bytes | None:
    """Bytes (from bytes, bytearray or a driver's memoryview), or None."""
    if isinstance(value, memoryview):
        return value.tobytes()
    return bytes(value) if isinstance(value, (bytes, bytearray)) else None


def clip(value: Any, n: int = 80) -> str:
    """A value fit for one line of a message: text as is, anything else as its repr, cut
    to ``n`` characters."""
    shown = value if isinstance(value, str) else repr(value)
    return shown if len(shown) <= n else shown[: n - 1] + "\u2026"


class _stored_length(FunctionElement[int]):
    """The stored size of a text column, in SQL."""

    type = Integer()
    inherit_cache = True


@compiles(_stored_length)
def _sqlite_length(element: _stored_length, compiler: Any, **kw: Any) -> str:
    return f"length({compiler.process(element.clauses, **kw)})"


@compiles(_stored_length, "postgresql")
def _postgresql_length(element: _stored_length, compiler: Any, **kw: Any) -> str:
    # octet_length reads the size from a TOASTed value's header; length() would
    # decompress it first (PostgreSQL compresses a repetitive 32 MiB text to 3 MB).
    return f"octet_length({compiler.process(element.clauses, **kw)})"


def bounded(column: ColumnElement[Any], limit: int) -> ColumnElement[Any]:
    """``column`` in a SELECT, as NULL where its text is longer than ``limit``: the bound
    is applied by the database, so an oversized value never leaves it (Python's readers
    then see None, which no reader trusts)."""
    # The limit is written into the SQL, not bound: some statements are run with a
    # parameter dict of their own, which knows nothing of an extra bind parameter.
    within = _stored_length(column) <= literal_column(str(int(limit)))
    return case((within, column), else_=null()).label(getattr(column, "name", None))
