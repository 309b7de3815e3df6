"""Reading stored entries safely: the key and timings columns, parsed and validated, and
the row of a listing.

A column read from shared storage is never trusted: anything written there (by an older
tunecache, a bad import, a hand edit) must cost only its own entry.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

from .. import stored_json
from ..keys import MAX_KEY_BYTES
from ..store import Database, engine

__all__ = ["PAGE", "LISTING_KEYS", "noop", "pages", "loads", "stored_key", "listing_row"]

PAGE = 1000  # rows per page of a listing, an export or a validation walk


def noop(_n: int) -> None:
    """A progress callback that reports nowhere."""


def pages(db: Database, page_after: Callable[[str], Any]) -> Iterator[list[Any]]:
    """The pages of a walk in key hash order: ``page_after(h)`` is the statement of the
    page after key hash ``h``. Keyset pagination: each page is its own short transaction,
    and no OFFSET rescans while a million rows stream out."""
    after = ""
    while True:
        page = db.run(functools.partial(engine.rows, statement=page_after(after)))
        if not page:
            return
        yield page
        after = page[-1].key_hash


def loads(text: str | bytes, limit: int) -> Any:
    """stored_json.loads of a stored column or an import line: StoredJSONError (a
    ValueError) for anything it refuses, a syntax error said by its column alone (the
    caller names the line or the column)."""
    try:
        return stored_json.loads(text, limit)
    except stored_json.StoredJSONError as e:
        cause = e.__context__
        if isinstance(cause, json.JSONDecodeError):
            raise stored_json.StoredJSONError(f"{cause.msg} at column {cause.colno}") from None
        raise


def stored_key(key_json: Any) -> dict[str, Any]:
    """A stored key column, parsed; ValueError(reason) when it is not a key."""
    if not isinstance(key_json, str):
        # NULL: absent, or longer than MAX_KEY_BYTES (the listing queries bound it in SQL).
        raise ValueError(f"key missing or larger than {MAX_KEY_BYTES} bytes")
    try:
        key = stored_json.loads(key_json, MAX_KEY_BYTES)
    except stored_json.StoredJSONError as e:
        raise ValueError(f"key is {e}") from None
    if not isinstance(key, dict):
        raise ValueError("key is not a JSON object")
    return key


def listing_row(row: Any) -> dict[str, Any]:
    """One row of ls, or of prune --dry-run, as a JSON-able dict."""
    return {
        "key_hash": row.key_hash, "state": row.state, "kind": row.kind, "op": row.op,
        "device": row.device, "torch": row.torch_version, "triton": row.triton_version,
        "hits": row.hits, "best": row.best, "tune_seconds": row.tune_seconds,
        "owner": row.owner, "created_at": row.created_at, "updated_at": row.updated_at,
        "last_used_at": row.last_used_at,
    }


LISTING_KEYS = ("key_hash", "state", "kind", "op", "device", "torch", "triton", "hits", "best",
                "tune_seconds", "owner", "created_at", "updated_at", "last_used_at")
