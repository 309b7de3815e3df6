"""Every statement the claim protocol runs, by name, over one :class:`Database`.

The protocol (docs/design.md): a key is claimed by inserting its row (state ``claimed``,
token 1) or by taking over a claimed row whose lease has passed (token + 1). Each of those
is one conditional statement, so two processes can never both win, on SQLite or
PostgreSQL, with or without an explicit row lock. A publish is an UPDATE guarded by the
token: an owner that lost its claim while frozen publishes nothing. ``done`` rows are never
updated again except for usage counters.

Time is the database's wherever it has one (PostgreSQL's ``now()``); SQLite runs inside the
process, so there it is the host's clock (``tunecache doctor`` reports skew).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    and_,
    bindparam,
    case,
    func,
    literal,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from ..keys import MAX_META_BYTES, MAX_TIMINGS_BYTES, Key
from ..settings import IMPLAUSIBLE_LEASE_SECONDS
from . import columns, gains
from .engine import Database
from .notify import Waiter, notify
from .schema import STATES, entries, usage

__all__ = ["ClaimStore", "Entry", "Claim", "StepOutcome", "Publication", "LEASE_PASSED",
           "LEASE_RUNNING", "lease_passed"]

# IN lists are chunked below SQLite's default limit on bound parameters (999 before 3.32).
_CHUNK = 500


class db_now(FunctionElement[float]):
    """Seconds since the epoch, as the database sees it."""

    type = Float()
    inherit_cache = True


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: Any, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


@compiles(db_now, "postgresql")
def _db_now_postgresql(element: Any, compiler: Any, **kw: Any) -> str:
    # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
    return "extract(epoch from clock_timestamp())::float8"


def lease_passed(lease_expires_at: Any, now: float) -> bool:
    """Whether a claim with this lease (as read: None or anything but a finite number
    counts as no lease) is nobody's any more: its
    lease has passed, or it ends further ahead than any tunecache sets one
    (settings.IMPLAUSIBLE_LEASE_SECONDS), so no owner will renew or finish it and waiting
    for it would only stall every job that needs the key. LEASE_PASSED says the same in
    SQL."""
    lease = columns.time(lease_expires_at)
    return lease is None or lease <= now or lease > now + IMPLAUSIBLE_LEASE_SECONDS


@dataclasses.dataclass(frozen=True)
class Entry:
    """One row, as read. ``now`` is the database's time at the read.

    Every column is untrusted: SQLite keeps what it cannot convert to a column's type (text
    in a REAL column), PostgreSQL's floats hold NaN and infinities, and a shared file may
    have been written by anything. :meth:`from_row` reads a value of the wrong type (or a
    time that is not finite) as None, and a state that is not text as its repr.
    """

    key_hash: str
    state: str
    owner: str | None
    token: int | None
    lease_expires_at: float | None
    attempts: int
    timings_json: str | None  # validated by keys.validate_timings where it is used
    tune_seconds: float | None
    error: str | None
    meta_json: str | None  # validated by keys.validate_meta where it is used
    now: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Entry:
        (key_hash, state, owner, token, lease, attempts, timings_json, tune_seconds, error,
         meta_json, now) = row
        seconds = columns.time(tune_seconds)
        return cls(
            str(key_hash), state if isinstance(state, str) else repr(state),
            columns.text(owner), columns.integer(token), columns.time(lease),
            columns.integer(attempts) or 0, columns.text(timings_json),
            seconds if seconds is not None and seconds >= 0 else None, columns.text(error),
            columns.text(meta_json), float(now),
        )

    @property
    def stranded(self) -> str | None:
        """Why no process will ever finish this row, or None. A state this tunecache does
        not know (a newer tunecache's) is not ours to settle; a claim without a numeric
        token is matched by no takeover. (A claim whose lease is no number is taken over:
        see :func:`lease_passed`.)"""
        if self.state not in STATES:
            return f"in state {self.state[:40]!r}, unknown to this tunecache"
        if self.state == "claimed" and self.token is None:
            return "claimed with a token that is not a number"
        return None

    @property
    def lease_expired(self) -> bool:
        """A claim whose owner's lease has passed, or that holds a lease no owner could
        have set (:func:`lease_passed`): anyone may take it over."""
        return (self.state == "claimed" and not self.stranded
                and lease_passed(self.lease_expires_at, self.now))

    @property
    def live_claim(self) -> bool:
        """A claim whose owner still holds its lease."""
        return self.state == "claimed" and not self.stranded and not self.lease_expired


@dataclasses.dataclass(frozen=True)
class Claim:
    key_hash: str
    token: int
    owner: str


@dataclasses.dataclass(frozen=True)
class Publication:
    """A result ready to be written under a claim."""

    claim: Claim
    timings_json: str
    best: str | None  # None when every candidate failed
    tune_seconds: float
    meta_json: str | None = None


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    published: list[bool]  # one per publication given, in order
    claimed: list[Claim]
    seen: dict[str, Entry]  # the rows read while looking for keys to claim


# A key's own row, its text columns bounded in SQL (columns.bounded): a planted 32 MiB
# value comes back NULL without leaving the database, and reads as no value. A state,
# owner or error past its bound is none tunecache writes (the longest state is 7
# characters, an owner a host name of 200 and a pid, an error 4000 characters).
MAX_STATE = 16
MAX_OWNER = 512
MAX_ERROR = 4000
# Read bounds are in bytes on PostgreSQL (octet_length): 4000 characters of UTF-8.
MAX_ERROR_BYTES = 4 * MAX_ERROR
_ENTRY_COLUMNS = (
    entries.c.key_hash,
    columns.bounded(entries.c.state, MAX_STATE),
    columns.bounded(entries.c.owner, MAX_OWNER),
    entries.c.token,
    entries.c.lease_expires_at,
    entries.c.attempts,
    columns.bounded(entries.c.timings_json, MAX_TIMINGS_BYTES),
    entries.c.tune_seconds,
    columns.bounded(entries.c.error, MAX_ERROR_BYTES),
    columns.bounded(entries.c.meta_json, MAX_META_BYTES),
)


# The statements of the protocol, built once: building a Core statement costs more than
# SQLite takes to run it.
_NOW = db_now()
_LEASE = entries.c.lease_expires_at
# lease_passed in SQL, for the takeover and the operators' statements. NULL is no lease
# (SQLite stores NaN as NULL). The upper bound catches the rest of what no honest owner
# writes: PostgreSQL sorts NaN above every number and SQLite sorts text and blobs in a
# REAL column above every number, so both count as too far ahead, like infinity.
_IMPLAUSIBLE = _NOW + literal(IMPLAUSIBLE_LEASE_SECONDS)
LEASE_PASSED = or_(_LEASE.is_(None), _LEASE <= _NOW, _LEASE > _IMPLAUSIBLE)
# Its negation, NULL-safe: a claim someone holds.
LEASE_RUNNING = and_(_LEASE.is_not(None), _LEASE > _NOW, _LEASE <= _IMPLAUSIBLE)
_FENCE = and_(
    entries.c.key_hash == bindparam("p_key_hash"),
    entries.c.state == "claimed",
    entries.c.token == bindparam("p_token"),
    entries.c.owner == bindparam("p_owner"),
)
_READ = select(*_ENTRY_COLUMNS, _NOW.label("now")).where(
    entries.c.key_hash.in_(bindparam("p_hashes", expanding=True))
)
_EXHAUSTED = entries.c.attempts >= bindparam("p_max_attempts")
_TAKE_OVER = (
    update(entries)
    .where(
        entries.c.key_hash == bindparam("p_key_hash"),
        entries.c.state == "claimed",
        entries.c.token == bindparam("p_token"),
        LEASE_PASSED,
    )
    .values(
        state=case((_EXHAUSTED, literal("failed")), else_=literal("claimed")),
        error=case(
            (_EXHAUSTED,
             func.coalesce(entries.c.error, literal("the tuning process died or hung"))),
            else_=entries.c.error,
        ),
        owner=case((_EXHAUSTED, entries.c.owner), else_=bindparam("p_owner")),
        token=entries.c.token + 1,
        attempts=case((_EXHAUSTED, entries.c.attempts), else_=entries.c.attempts + 1),
        lease_expires_at=_NOW + bindparam("p_lease_seconds"),
        updated_at=_NOW,
    )
    .returning(entries.c.state, entries.c.token)
)
_PUBLISH = (
    update(entries)
    .where(_FENCE)
    .values(
        state="done",
        timings_json=bindparam("p_timings_json"),
        best=bindparam("p_best"),
        tune_seconds=bindparam("p_tune_seconds"),
        meta_json=bindparam("p_meta_json"),
        lease_expires_at=None,
        error=None,
        updated_at=_NOW,
        last_used_at=_NOW,
        **gains.publish_assignments(),
    )
)
_HEARTBEAT = (
    update(entries).where(_FENCE).values(lease_expires_at=_NOW + bindparam("p_lease_seconds"))
)
_RELEASE_FAILED = (
    update(entries)
    .where(_FENCE)
    .values(
        state=case((_EXHAUSTED, literal("failed")), else_=literal("claimed")),
        lease_expires_at=_NOW,
        error=bindparam("p_error"),
        updated_at=_NOW,
    )
    .returning(entries.c.state)
)
# A claim given back unused (its tuning was not needed after all): not an attempt.
_GIVE_BACK = (
    update(entries)
    .where(_FENCE)
    .values(lease_expires_at=_NOW, attempts=entries.c.attempts - 1, updated_at=_NOW)
    .returning(entries.c.state)
)
# A new key's neighbours: done entries of its kind and family, the most recently
# published first (a family can hold thousands of sizes; the caller ranks the ones read by
# distance). Not the most used first: a hits count is whatever a row's writer put there,
# and 64 rows planted with a huge one pushed every genuine neighbour out of the read. A
# publish time is the database's clock, and one ahead of it (or not a number: SQLite keeps
# text there, PostgreSQL NaN) ranks last, so no field of a planted row outranks a genuine
# publish made after it.
_PUBLISHED = case((entries.c.updated_at <= _NOW, entries.c.updated_at), else_=null())
# What one neighbour read may cost: the caller keeps at most a few neighbours, and real
# ones are small (a GEMM key under 2 KiB, its timings a few hundred candidates of ~150
# characters, its meta a few hundred bytes), so each column is bounded far tighter than a
# key's own read: at most 64 rows of 16 + 64 + 8 KiB, under 6 MiB, where the column
# limits allow 72 MiB. A genuine neighbour past these bounds is skipped like any bad row
# (the new key is tuned from the others, or in full).
NEIGHBOUR_KEY_BYTES = 16 * 1024
NEIGHBOUR_TIMINGS_BYTES = 64 * 1024
NEIGHBOUR_META_BYTES = 8 * 1024
_NEIGHBOURS = (
    select(entries.c.key_hash,
           columns.bounded(entries.c.key_json, NEIGHBOUR_KEY_BYTES),
           columns.bounded(entries.c.timings_json, NEIGHBOUR_TIMINGS_BYTES),
           columns.bounded(entries.c.meta_json, NEIGHBOUR_META_BYTES))
    .where(entries.c.kind == bindparam("p_kind"), entries.c.family == bindparam("p_family"),
           entries.c.state == "done", entries.c.key_hash != bindparam("p_key_hash"))
    .order_by(_PUBLISHED.desc().nulls_last(), entries.c.key_hash)
    .limit(bindparam("p_limit"))
)
# Meta is the one part of a done row that may change after its publish (timings never
# do): `tunecache warm --exhaustive` adds the regret it measured.
_SET_META = (
    update(entries)
    .where(entries.c.key_hash == bindparam("p_key_hash"), entries.c.state == "done")
    .values(meta_json=bindparam("p_meta_json"), **gains.assignments())
)
_RECORD_HITS = (
    update(entries)
    .where(entries.c.key_hash == bindparam("p_h"))
    .values(hits=entries.c.hits + bindparam("p_n"), last_used_at=_NOW)
)


def insert_if_absent(dialect: str, *, returning: bool = True, **values: Any) -> Any:
    """INSERT of a new row for a key (its hash, JSON and labels bound as p_*), doing nothing
    if the key exists; RETURNING the token, so no row back means someone was first
    (``returning=False``: nothing, for a driver's executemany of many rows)."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    identity: dict[str, Any] = {name: bindparam(f"p_{name}") for name in (
        "key_hash", "key_json", "kind", "op", "device", "torch_version", "triton_version",
        "family")}
    statement = (
        insert(entries)
        .values(**{**identity, "token": 1, "created_at": _NOW, "updated_at": _NOW, "hits": 0,
                   **values})
        .on_conflict_do_nothing(index_elements=["key_hash"])
    )
    return statement.returning(entries.c.token) if returning else statement


def _insert_claim_statement(dialect: str) -> Any:
    return insert_if_absent(
        dialect,
        state="claimed",
        owner=bindparam("p_owner"),
        lease_expires_at=_NOW + bindparam("p_lease_seconds"),
        attempts=1,
    )


_INSERT_CLAIM = {d: _insert_claim_statement(d) for d in ("sqlite", "postgresql")}


def _params(**values: Any) -> dict[str, Any]:
    # Bound parameters may not share a column's name in INSERT/UPDATE statements.
    return {f"p_{name}": value for name, value in values.items()}


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


class ClaimStore:
    """Named operations of the claim protocol. Knows nothing of torch or of tuning."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._waiter: Waiter | None = None

    # -- reads -------------------------------------------------------------------------

    def read(self, hashes: Sequence[str]) -> dict[str, Entry]:
        def work(conn: Connection) -> dict[str, Entry]:
            return self._read(conn, hashes)

        return self.db.run(work)

    def _read(self, conn: Connection, hashes: Sequence[str]) -> dict[str, Entry]:
        found: dict[str, Entry] = {}
        for chunk in _chunks(list(hashes)):
            for row in conn.execute(_READ, _params(hashes=list(chunk))):
                found[row.key_hash] = Entry.from_row(row)
        return found

    def neighbours(self, kind: str, family: str, key_hash: str,
                   limit: int) -> list[tuple[str, str | None, str | None, str | None]]:
        """(key hash, key JSON, timings JSON, meta JSON) of up to ``limit`` done entries of
        ``kind`` and ``family`` other than ``key_hash``; untrusted text, unvalidated."""

        def work(conn: Connection) -> list[tuple[str, str | None, str | None, str | None]]:
            rows = conn.execute(_NEIGHBOURS, _params(kind=kind, family=family,
                                                     key_hash=key_hash, limit=limit))
            return [(str(r.key_hash), columns.text(r.key_json), columns.text(r.timings_json),
                     columns.text(r.meta_json)) for r in rows]

        return self.db.run(work)

    def set_meta(self, key_hash: str, meta_json: str | None) -> bool:
        """Replace a done entry's meta; False if it is not done (or not there)."""

        def work(conn: Connection) -> bool:
            # The gain columns follow the meta; a GEMM's may come from its timings.
            row = conn.execute(gains.SOURCE, {"p_key_hash": key_hash}).first()
            if row is None:
                return False
            return conn.execute(_SET_META, {**_params(key_hash=key_hash, meta_json=meta_json),
                                            **gains.params(row.kind, row.timings_json,
                                                           meta_json)}).rowcount == 1

        return self.db.run(work, write=True)

    # -- the claim protocol ------------------------------------------------------------

    def step(
        self,
        *,
        publish: Sequence[Publication],
        give_back: Sequence[Claim] = (),
        candidates: Sequence[Key],
        limit: int,
        owner: str,
        lease_seconds: float,
        max_attempts: int,
    ) -> StepOutcome:
        """Claim up to ``limit`` free keys of ``candidates`` (in their order), then publish
        results and give back claims not tuned (not an attempt, see :meth:`release`), in
        one write transaction: on SQLite every commit is a few fsyncs on a shared disk, so
        a tuned key costs one commit, not two.

        ``candidates`` are the keys to claim, hashed by the caller; none of them may be in
        ``give_back`` (a key given back here is free from the next step on).

        Claims come first because only they wait on peers: an INSERT waits for any
        transaction that wrote a row of that key, and a peer that read the keys before our
        claim on one committed still inserts it. Publishing first locked rows of ours, out
        of list order, before we waited on a peer that might wait on them: PostgreSQL
        steps deadlocked, 1 s to detect each, and under load a batched step's retries
        deadlocked until the lock timeout. Once it has claimed, a step writes only rows of
        its own, which only its own heartbeat also writes.
        """

        def work(conn: Connection) -> StepOutcome:
            seen = self._read(conn, [c.hash for c in candidates]) if candidates else {}
            claimed: list[Claim] = []
            for key in candidates:
                if len(claimed) >= limit:
                    break
                row = seen.get(key.hash)
                if row is None:
                    claim = self._insert_claim(conn, key, owner, lease_seconds)
                elif row.lease_expired:
                    claim = self._take_over(conn, row, owner, lease_seconds, max_attempts)
                else:
                    continue
                if claim is not None:
                    claimed.append(claim)
                else:
                    # Lost a race (PostgreSQL reads without locks); the row is someone's now.
                    seen.update(self._read(conn, [key.hash]))
            published = [self._publish(conn, pub) for pub in publish]
            returned = [
                conn.execute(_GIVE_BACK, self._fence(claim)).first() is not None
                for claim in give_back
            ]
            if any(published) or any(returned):
                self._notify(conn)
            return StepOutcome(published, claimed, seen)

        return self.db.run(work, write=True)

    def _insert_claim(
        self, conn: Connection, key: Key, owner: str, lease_seconds: float
    ) -> Claim | None:
        row = conn.execute(
            _INSERT_CLAIM[self.db.dialect],
            _params(**key.labels, key_hash=key.hash, key_json=key.json, family=key.family,
                    owner=owner, lease_seconds=lease_seconds),
        ).first()
        return Claim(key.hash, 1, owner) if row is not None else None

    def _take_over(
        self, conn: Connection, row: Entry, owner: str, lease_seconds: float, max_attempts: int
    ) -> Claim | None:
        """Claim a row whose owner's lease has passed; past max_attempts, mark it failed."""
        result = conn.execute(
            _TAKE_OVER,
            _params(key_hash=row.key_hash, token=row.token, owner=owner,
                    lease_seconds=lease_seconds, max_attempts=max_attempts),
        ).first()
        if result is None or result.state != "claimed":
            if result is not None:
                self._notify(conn)
            return None
        return Claim(row.key_hash, result.token, owner)

    @staticmethod
    def _fence(claim: Claim, **more: Any) -> dict[str, Any]:
        return _params(key_hash=claim.key_hash, token=claim.token, owner=claim.owner, **more)

    def _publish(self, conn: Connection, pub: Publication) -> bool:
        result = conn.execute(
            _PUBLISH,
            {**self._fence(pub.claim, timings_json=pub.timings_json, best=pub.best,
                           tune_seconds=pub.tune_seconds, meta_json=pub.meta_json),
             **gains.publish_params(pub.timings_json, pub.meta_json)},
        )
        return result.rowcount == 1

    def heartbeat(self, claims: Sequence[Claim], lease_seconds: float) -> set[str]:
        """Extend the leases of claims; return the key hashes of those lost: taken over
        by a peer (another token or owner) or gone. A claim its owner published or gave
        back while this ran is not lost, so a renewal racing a publish reports nothing."""

        def work(conn: Connection) -> set[str]:
            missed = [
                claim for claim in claims
                if conn.execute(
                    _HEARTBEAT, self._fence(claim, lease_seconds=lease_seconds)
                ).rowcount != 1
            ]
            rows = self._read(conn, [claim.key_hash for claim in missed]) if missed else {}
            return {
                claim.key_hash for claim in missed
                if (row := rows.get(claim.key_hash)) is None
                or (row.token, row.owner) != (claim.token, claim.owner)
            }

        return self.db.run(work, write=True)

    def release(
        self, claim: Claim, error: str, max_attempts: int, *, failed: bool = True
    ) -> str | None:
        """Give the key back (lease expired now) for another attempt, or mark it failed
        once it has had max_attempts (the tuner raised). ``failed=False``: the claim was
        not needed after all, and does not count as an attempt. Returns the new state
        (None: claim lost).
        """

        def work(conn: Connection) -> str | None:
            row = conn.execute(
                _RELEASE_FAILED if failed else _GIVE_BACK,
                self._fence(claim, error=error[:MAX_ERROR], max_attempts=max_attempts),
            ).first()
            if row is not None:
                self._notify(conn)
            return None if row is None else str(row.state)

        return self.db.run(work, write=True)

    def _notify(self, conn: Connection) -> None:
        notify(conn, self.db.dialect)

    def wait_for_change(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, less if a key is published or given back
        meanwhile (where the database can tell: PostgreSQL). Only cuts a poll's sleep
        short; the caller re-reads what it waits for either way."""
        if self._waiter is None or self._waiter.pid != os.getpid():
            self._waiter = Waiter(self.db)
        self._waiter.wait(timeout)

    # -- usage ---------------------------------------------------------------------------

    def record_usage(
        self, hits_by_key: Mapping[str, int], counts: Mapping[str, float]
    ) -> None:
        """Add hit counts and one usage row, in one transaction (batched by the caller)."""

        def work(conn: Connection) -> None:
            if hits_by_key:
                conn.execute(
                    _RECORD_HITS, [_params(h=h, n=n) for h, n in sorted(hits_by_key.items())]
                )
            conn.execute(
                usage.insert().values(
                    recorded_at=_NOW,
                    host=socket.gethostname()[:256],
                    pid=os.getpid(),
                    hits=int(counts.get("hit", 0)),
                    tuned=int(counts.get("tuned", 0)),
                    peer=int(counts.get("peer", 0)),
                    local=int(counts.get("local", 0)),
                    seconds_saved=float(counts.get("seconds_saved", 0.0)),
                    seconds_tuning=float(counts.get("seconds_tuning", 0.0)),
                )
            )

        self.db.run(work, write=True)
