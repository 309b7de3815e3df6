"""Re-claiming a done entry that its readers cannot use, so that it is replaced.

A decided entry that names none of a compile's candidates (a planted or foreign decision)
made every later job warn and tune in full, for good: entries are immutable, so nothing
replaced it. The first job that measures the key claims it again here and publishes
its own measurement through the usual protocol (claims.py).
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, func, literal, update

from .claims import _NOW, Claim, Entry, _params
from .engine import Database
from .notify import notify
from .schema import entries

__all__ = ["reclaim"]

# A done entry its readers found inapplicable (it names none of their candidates: a
# planted decision), claimed again so that the next measurement replaces it; fenced by
# the token read with it, so that one reader re-claims it and the others wait for it.
_token_or_0 = func.coalesce(entries.c.token, literal(0))
_RECLAIM = (
    update(entries)
    .where(entries.c.key_hash == bindparam("p_key_hash"), entries.c.state == "done",
           _token_or_0 == bindparam("p_token"))
    .values(state="claimed", owner=bindparam("p_owner"), token=_token_or_0 + 1, attempts=1,
            lease_expires_at=_NOW + bindparam("p_lease_seconds"), error=None,
            updated_at=_NOW)
    .returning(entries.c.token)
)


def reclaim(db: Database, row: Entry, owner: str, lease_seconds: float) -> Claim | None:
    """Claim the done ``row`` again (as read: fenced by its token), for its entry to be
    replaced; None where it changed since it was read (a peer re-claimed it first)."""

    def work(conn: Connection) -> Claim | None:
        found = conn.execute(_RECLAIM, _params(
            key_hash=row.key_hash, token=row.token or 0, owner=owner,
            lease_seconds=lease_seconds)).first()
        if found is not None:
            notify(conn, db.dialect)
        return None if found is None else Claim(row.key_hash, int(found[0]), owner)

    return db.run(work, write=True)
