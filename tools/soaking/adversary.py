"""The adversary: hostile rows and files planted where the workers will look next, one
case by turns."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import signal
import sqlite3
import time
import uuid
from typing import Any

from .common import (
    CANDIDATES,
    GEMM_CANDIDATES,
    HOSTILE_EVERY,
    KEYS_PER_GENERATION,
    EventLog,
    generation,
    graph_digest,
    graph_key,
    has_family,
    neighbour_key,
    workload_key,
)
from .postgres import libpq_url

# Cases the adversary plants, by turns; those of blob files exist only beside a SQLite
# database (PostgreSQL keeps payloads in the row).
CASES = [
    "lease_far_future", "graph_size_2gib", "blob_fifo", "lease_nan", "hostile_names",
    "blob_shard_symlink", "lease_negative", "graph_size_negative", "keys_shard_symlink",
    "garbled_timings", "lease_wrong_type", "lock_symlink", "graph_size_int64_max",
    "verify_key_world_writable",
]
# The cases of neighbour rows (and of huge numbers and oversize text in a stored column).
CASES += ["huge_int_timings", "huge_int_meta", "huge_transfer_benchmarked", "nan_meta",
          "hits_crowding", "family_escape", "oversize_meta", "oversize_timings"]
# A few MiB of text each: planted on one turn of the cases in RARE_EVERY, so that the
# database stays small (a key's meta may have 64 KiB, its timings 1 MiB).
RARE = {"oversize_meta", "oversize_timings"}
RARE_EVERY = 3
OVERSIZE_BYTES = 4 * 2**20
NEIGHBOUR_TIMINGS = json.dumps({GEMM_CANDIDATES[0]: 0.5, GEMM_CANDIDATES[1]: 0.25})
HUGE_310 = "1" + "0" * 309  # a JSON integer of 310 digits: float() of it overflows


def raw_json(value: Any, **raw: str) -> str:
    """The JSON text of ``value``, each string ``"@name@"`` in it replaced by the text
    ``raw[name]``: what no encoder writes (a 4300-digit integer, NaN)."""
    text = json.dumps(value)
    for name, replacement in raw.items():
        text = text.replace(json.dumps(f"@{name}@"), replacement)
    return text
SQLITE_ONLY = {"blob_fifo", "blob_shard_symlink", "keys_shard_symlink", "lock_symlink"}
OLD = 1_000_000_000.0  # 2001-09-09: the mtime of canary files and old hostile rows
_ENTRY_COLUMNS = ("key_hash", "key_json", "kind", "op", "device", "torch_version",
                  "triton_version", "state", "owner", "token", "lease_expires_at", "attempts",
                  "timings_json", "best", "tune_seconds", "error", "created_at", "updated_at",
                  "last_used_at", "hits", "family", "meta_json")
_ARTIFACT_COLUMNS = ("kind", "cache_key", "digest", "signature", "size", "torch_version",
                     "created_at", "last_used_at", "payload")


class RawText(bytes):
    """Bytes that SQLite is to store as TEXT as they are (invalid UTF-8: a lone surrogate
    encoded as a C writer would), which Python's sqlite3 cannot bind as a str."""


def _upsert(table: str, columns: tuple[str, ...], conflict: str, row: dict[str, Any],
            pg: bool) -> tuple[str, list[Any]]:
    """An INSERT that overwrites the row of the same identity: the adversary writes what
    it likes, where it likes."""
    marks = ["CAST(? AS TEXT)" if isinstance(row[c], RawText) else "?" for c in columns]
    keep = set(conflict.split(", "))
    sql = (f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(marks)}) "
           f"ON CONFLICT ({conflict}) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in columns if c not in keep))
    params = [bytes(row[c]) if isinstance(row[c], RawText) else row[c] for c in columns]
    return (sql.replace("?", "%s") if pg else sql), params


class Adversary:
    """Writes the shared storage as anyone who can, without the private key: hostile rows
    in the database, and on SQLite FIFOs and symlinks among the blob files, pointing at
    "canary" files outside the cache that nothing may touch. Every plant is one line of
    ``plants.jsonl``: its case, the workload keys and graphs it aims at, and the canary
    files it made (path, sha256, mode) for the check at the end."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.pg = spec["url"].startswith("postgresql")
        self.rng = random.Random(f"{spec['seed']}:adversary")
        self.log = EventLog(os.path.join(spec["logdir"], "plants.jsonl"))
        self.blobs: str = spec.get("blobs") or ""  # SQLite's blob root ("" on PostgreSQL)
        self.planted: dict[str, set[int]] = {"keys": set(), "graphs": set()}
        self.made = 0
        self.rows: list[str] = []  # hashes of the entry rows the plant under way wrote

    def run(self) -> None:
        cases = [c for c in CASES if not (self.pg and c in SQLITE_ONLY)]
        # The key file first, so that jobs handed it find it from the start.
        cases.remove("verify_key_world_writable")
        cases.insert(0, "verify_key_world_writable")
        n = 0
        while time.time() < self.spec["deadline"]:
            case = cases[n % len(cases)]
            n += 1
            if case in RARE and (n - 1) // len(cases) % RARE_EVERY:
                continue  # planted on one turn of the cases in RARE_EVERY
            self.rows = []
            try:
                record = getattr(self, case)()
            except Exception as e:  # noqa: BLE001 - a plant that did not take is skipped
                record = {"skipped": f"{type(e).__name__}: {e}"[:300]}
            # Every row written, whether the plant took or not (a statement may have run).
            self.log.write(case=case, t=time.time(), rows=self.rows, **record)
            time.sleep(HOSTILE_EVERY)

    # -- targets

    def _upcoming(self, count: int, what: str = "keys", family: bool = False) -> list[int]:
        """Workload numbers (keys or graphs) no job has asked for yet, but soon will. Keys
        are asked for only in their generation's second, by calls that start at one of
        its first three keys, so the third key of each of the next generations comes
        first: one key per generation, since a second in which no call starts (the
        workers' start-up, a kill storm) would miss them all. ``family``: only keys of a
        family (whose jobs read their neighbours)."""
        first = generation(self.spec) + 3
        if what == "keys":
            # A cheap call asks for up to 24 keys (6 generations) from its own: further
            # ahead than that, no job has claimed the key yet.
            first += 4
            order = [g * KEYS_PER_GENERATION + offset for offset in (2, 1, 3, 0)
                     for g in range(first, first + 8)]
        else:
            order = list(range(first, first + 32))
        found = [i for i in order if i not in self.planted[what]
                 and (not family or has_family(i))][:count]
        self.planted[what].update(found)
        return found

    def _recent_graphs(self) -> list[int]:
        """Graphs jobs published a moment ago and keep loading (none of ours)."""
        top = generation(self.spec)
        return [i for i in range(max(0, top - 3), top) if i not in self.planted["graphs"]]

    # -- SQL

    def _execute(self, statements: list[tuple[str, list[Any]]]) -> None:
        if self.pg:
            import psycopg

            with psycopg.connect(libpq_url(self.spec["url"]), connect_timeout=5,
                                 application_name="soak-adversary") as conn:
                conn.execute("SET statement_timeout = '5s'")
                for sql, params in statements:
                    conn.execute(sql, params)
            return
        # Longer than a frozen worker holds the write lock (3 leases at most).
        db = sqlite3.connect(self.spec["url"].split("///", 1)[1], timeout=15,
                             isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=TRUNCATE")
            db.execute("BEGIN IMMEDIATE")
            for sql, params in statements:
                db.execute(sql, params)
            db.execute("COMMIT")
        finally:
            db.close()

    def _entry(self, number: int | None, key: Any = None,
               **columns: Any) -> tuple[str, list[Any]]:
        """A row of workload key ``number``, of ``key`` (a Key: a neighbour), or of a hash
        no job asks for; its hash is recorded as one the adversary tampered with."""
        now = time.time()
        if number is None and key is None:
            row: dict[str, Any] = {"key_hash": uuid.uuid4().hex * 2, "key_json": "{}",
                                   "kind": "gemm", "op": "mm", "device": "cpu",
                                   "torch_version": "2.13", "triton_version": None,
                                   "family": None}
        else:
            key = key or workload_key(self.spec["run"], number or 0)
            row = {"key_hash": key.hash, "key_json": key.json, **key.labels,
                   "family": key.family}
        row.update(state="claimed", owner="adversary", token=1, lease_expires_at=now,
                   attempts=1, timings_json=None, best=None, tune_seconds=None, error=None,
                   created_at=now, updated_at=now, last_used_at=None, hits=0, meta_json=None)
        row.update(columns)
        self.rows.append(row["key_hash"])
        return _upsert("tunecache_entries", _ENTRY_COLUMNS, "key_hash", row, self.pg)

    def _artifact(self, kind: str, key: str, size: int, payload: bytes,
                  **columns: Any) -> tuple[str, list[Any]]:
        digest = hashlib.sha256(payload).hexdigest()
        if self.blobs:
            self._write_blob(digest, payload)
        row = {"kind": kind, "cache_key": key, "digest": digest,
               "signature": self.rng.randbytes(64), "size": size, "torch_version": "soak",
               "created_at": time.time(), "last_used_at": time.time(),
               "payload": payload if self.pg else None, **columns}
        return _upsert("tunecache_artifacts", _ARTIFACT_COLUMNS, "kind, cache_key", row,
                       self.pg)

    def _lease_case(self, values: list[Any], **columns: Any) -> dict[str, Any]:
        numbers = self._upcoming(len(values))
        self._execute([self._entry(n, lease_expires_at=v, **columns)
                       for n, v in zip(numbers, values)])
        return {"keys": numbers, "variant": [repr(v) for v in values]}

    # -- claims no live owner holds

    def lease_far_future(self) -> dict[str, Any]:
        return self._lease_case([1e300, 253402300799.0])  # and 9999-12-31T23:59:59Z

    def lease_nan(self) -> dict[str, Any]:
        # SQLite stores a NaN bound from Python as NULL; PostgreSQL's float8 keeps it.
        return self._lease_case([float("nan")])

    def lease_negative(self) -> dict[str, Any]:
        return self._lease_case([-1.0, -1e300])

    def lease_wrong_type(self) -> dict[str, Any]:
        if self.pg:  # a typed column: the nearest to a wrong type are the infinities
            return self._lease_case([float("inf"), float("-inf")])
        # SQLite keeps text and bytes in a REAL column, and text in an INTEGER one.
        lease = self._lease_case(["next week", b"\x00\xff"])
        token = self._lease_case([time.time() + 3600.0], token="one")
        return {"keys": lease["keys"] + token["keys"],
                "variant": lease["variant"] + ["token 'one'"]}

    # -- rows that are not what a publisher wrote

    def garbled_timings(self) -> dict[str, Any]:
        texts = ['{"aten": 0.1,', '{"aten": "fast"}', "[1, 2]", "null", '{"aten": NaN}',
                 "\x1b[2J{}"]
        chosen = self.rng.sample(texts, 2)
        numbers = self._upcoming(2)
        self._execute([self._entry(n, state="done", lease_expires_at=None, timings_json=t,
                                   best="aten", tune_seconds=0.1, last_used_at=time.time())
                       for n, t in zip(numbers, chosen)])
        return {"keys": numbers, "variant": chosen}

    # -- neighbours: rows of the family of a key jobs will ask for next, read (through
    # TuneCache.neighbours) by the job that tunes it

    def _neighbours(self, rows: list[dict[str, Any]], variant: Any,
                    far: bool = False) -> dict[str, Any]:
        """Done rows (columns in ``rows``) of keys near (``far``: 6 octaves from) the
        next key of a family; that key is aimed at, not written."""
        (i,) = self._upcoming(1, family=True)
        now = time.time()
        self._execute([
            self._entry(None, neighbour_key(self.spec["run"], i, 129 + n,
                                            (i + 1) * 64 if far else None),
                        **{"state": "done", "lease_expires_at": None,
                           "timings_json": NEIGHBOUR_TIMINGS, "best": GEMM_CANDIDATES[1],
                           "tune_seconds": 0.1, "last_used_at": now, **columns})
            for n, columns in enumerate(rows)])
        return {"aimed": [i], "variant": variant}

    def huge_int_timings(self) -> dict[str, Any]:
        """A 310-digit integer timing: in a neighbour of the next key of a family, and in
        the own done row of another key jobs will ask for."""
        timings = raw_json({GEMM_CANDIDATES[0]: "@huge@", GEMM_CANDIDATES[1]: 0.25},
                           huge=HUGE_310)
        record = self._neighbours([{"timings_json": timings}], "310 digits")
        (j,) = self._upcoming(1)
        names = GEMM_CANDIDATES if has_family(j) else CANDIDATES
        own = raw_json({names[0]: "@huge@", names[1]: 0.25}, huge=HUGE_310)
        self._execute([self._entry(j, state="done", lease_expires_at=None, timings_json=own,
                                   best=names[1], tune_seconds=0.1, last_used_at=time.time())])
        return {**record, "keys": [j]}

    def huge_int_meta(self) -> dict[str, Any]:
        meta = raw_json({"baseline": {"candidate": GEMM_CANDIDATES[0], "ms": "@huge@"},
                         "best_ms": "@huge@"}, huge=HUGE_310)
        return self._neighbours([{"meta_json": meta}], "310 digits in baseline.ms, best_ms")

    def huge_transfer_benchmarked(self) -> dict[str, Any]:
        """Two rows whose transfer.benchmarked has 4300 digits: their sum has more than
        Python converts to text."""
        meta = raw_json({"transfer": {"from": [], "benchmarked": "@huge@", "generated": 3}},
                        huge="1" + "0" * 4299)
        return self._neighbours([{"meta_json": meta}, {"meta_json": meta}], "4300 digits")

    def nan_meta(self) -> dict[str, Any]:
        metas = [raw_json({"best_ms": "@nan@", "baseline": {"candidate": GEMM_CANDIDATES[0],
                                                           "ms": "@inf@"}},
                          nan="NaN", inf="Infinity"),
                 raw_json({"best_ms": "@inf@", "transfer": {"from": [], "benchmarked": "@nan@",
                                                            "generated": 3}},
                          nan="NaN", inf="-Infinity")]
        return self._neighbours([{"meta_json": m} for m in metas], "NaN, Infinity")

    def oversize_meta(self) -> dict[str, Any]:
        meta = json.dumps({"pad": "x" * OVERSIZE_BYTES})
        return self._neighbours([{"meta_json": meta}] * 2, f"{len(meta)} bytes")

    def oversize_timings(self) -> dict[str, Any]:
        timings = json.dumps({GEMM_CANDIDATES[0]: 0.5, GEMM_CANDIDATES[2]: "9" * OVERSIZE_BYTES})
        return self._neighbours([{"timings_json": timings}] * 2, f"{len(timings)} bytes")

    def hits_crowding(self) -> dict[str, Any]:
        """More rows than a key reads neighbours (64), far from it in size and used an
        enormous number of times, so that they come first: genuine neighbours are
        crowded out (slower tuning, never a wrong one)."""
        hits = 2**31 - 1 if self.pg else 2**62  # PostgreSQL's column is an int4
        return self._neighbours([{"hits": hits}] * 70, f"70 rows of {hits} hits", far=True)

    def family_escape(self) -> dict[str, Any]:
        """A done row whose family holds terminal escapes, CR and a newline."""
        (i,) = self._upcoming(1, family=True)
        family = "\x1b]0;owned\x07\x1b[2J\r\nfamily\x1b[0m"
        key = dataclasses.replace(neighbour_key(self.spec["run"], i), family=family)
        self._execute([self._entry(None, key, state="done", lease_expires_at=None,
                                   timings_json=NEIGHBOUR_TIMINGS, best=GEMM_CANDIDATES[1],
                                   tune_seconds=0.1, last_used_at=time.time())])
        return {"variant": repr(family)}

    def hostile_names(self) -> dict[str, Any]:
        old = self.rng.random() < 0.5  # old ones are what prune --older-than selects
        when = OLD if old else time.time()
        names: dict[str, Any] = {"kind": "gemm\r\x1b[2K", "op": "\x1b[31mmm\x1b[0m\x1b]0;owned\x07",
                 "device": "cpu\nFAKE LINE  done  aten", "torch_version": "2.13\x1b[5m",
                 "triton_version": "3.\u202e1"}
        if not self.pg:  # PostgreSQL refuses NUL and invalid UTF-8 in text
            names.update(torch_version="2.13\x00evil", triton_version=RawText(b"3.\xed\xa0\x80"))
        key_json = json.dumps({"kind": "gemm", "op": "\x1b[31mmm\nx"}) + "\x1b[0m"
        statements = [self._entry(None, state="done", lease_expires_at=None, key_json=key_json,
                                  timings_json='{"aten": 0.5}', best="aten\x1b[1m",
                                  tune_seconds=0.5, created_at=when, updated_at=when,
                                  last_used_at=when, **names)]
        key = "\x1b[2Jgraph\nkey\x07" + ("\x00nul" if not self.pg else "") + uuid.uuid4().hex
        payload = self.rng.randbytes(100)
        statements.append(self._artifact("fxgraph", key, len(payload), payload,
                                         torch_version="2.13\x1b[5m\n", created_at=when,
                                         last_used_at=when))
        self._execute(statements)
        return {"variant": "old" if old else "new"}

    def _graph_size(self, size: int) -> dict[str, Any]:
        (i,) = self._upcoming(1, "graphs")
        kind, key = graph_key(self.spec["run"], i)
        self._execute([self._artifact(kind, key, size, self.rng.randbytes(512))])
        return {"graphs": [i], "variant": size}

    def graph_size_2gib(self) -> dict[str, Any]:
        return self._graph_size(2 * 2**30)

    def graph_size_negative(self) -> dict[str, Any]:
        return self._graph_size(-10**18)

    def graph_size_int64_max(self) -> dict[str, Any]:
        return self._graph_size(2**63 - 1)

    # -- key files

    def verify_key_world_writable(self) -> dict[str, Any]:
        keys = self.spec["keys"]
        with open(keys["verify"], "rb") as f:
            data = f.read()
        tmp = f"{keys['hostile_verify']}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666)  # whatever the umask: writable by every user
        os.replace(tmp, keys["hostile_verify"])
        return {"variant": oct(os.stat(keys["hostile_verify"]).st_mode & 0o777)}

    # -- blob files (SQLite)

    def _real_dir(self, path: str) -> bool:
        """Make ``path`` a real directory under the blob root, unless a symlink (one of
        ours) is in the way: the adversary never creates anything through one."""
        walk = self.blobs
        for part in [".", *os.path.relpath(path, self.blobs).split(os.sep)]:
            walk = os.path.normpath(os.path.join(walk, part))
            if os.path.islink(walk):
                return False
            os.makedirs(walk, exist_ok=True)
        return True

    def _write_blob(self, digest: str, payload: bytes) -> None:
        shard = os.path.join(self.blobs, digest[:2])
        if self._real_dir(shard):
            path = os.path.join(shard, digest)
            with open(f"{path}.adv", "wb") as f:
                f.write(payload)
            os.replace(f"{path}.adv", path)

    def _canary_file(self, folder: str, name: str, content: bytes, mode: int) -> dict[str, Any]:
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(content)
        os.chmod(path, mode)
        os.utime(path, (OLD, OLD))
        return {"path": path, "sha256": hashlib.sha256(content).hexdigest(), "mode": mode}

    def _canary_dir(self, prefix: str, lock_names: bool) -> tuple[str, list[dict[str, Any]]]:
        """A directory outside the cache holding old files named like what a prune
        removes from a shard (orphan blobs, leftovers of writers, stale locks)."""
        self.made += 1
        folder = os.path.join(self.spec["canary"], f"dir-{self.made}")
        os.makedirs(folder)
        def fake() -> str:
            return prefix + uuid.uuid4().hex + uuid.uuid4().hex[:30]

        names = ([f"{fake()}.lock", f"{fake()}.lock"] if lock_names
                 else [fake(), f"{fake()}.lock", f"{fake()}.tmp.1.deadbeef"])
        files = [self._canary_file(folder, n, f"canary {n}\n".encode(), 0o644)
                 for n in [*names, "precious.txt"]]
        os.utime(folder, (OLD, OLD))
        return folder, files

    def _symlink_shard(self, parent: str, prefix: str, lock_names: bool) -> dict[str, Any]:
        shard = os.path.join(parent, prefix)
        if not self._real_dir(parent) or os.path.islink(shard):
            return {"skipped": "shard already a symlink"}
        folder, files = self._canary_dir(prefix, lock_names)
        if os.path.isdir(shard):  # out of the cache, as an adversary may
            self.made += 1
            os.rename(shard, os.path.join(self.spec["trash"], f"shard-{self.made}"))
        tmp = os.path.join(parent, f".adv-{uuid.uuid4().hex}")
        os.symlink(folder, tmp)
        os.replace(tmp, shard)
        return {"canary": files, "canary_dirs": [folder], "variant": shard}

    def blob_shard_symlink(self) -> dict[str, Any]:
        (i,) = self._upcoming(1, "graphs")
        digest = graph_digest(self.spec["run"], i)
        return {"graphs": [i], **self._symlink_shard(self.blobs, digest[:2], False)}

    def keys_shard_symlink(self) -> dict[str, Any]:
        (i,) = self._upcoming(1, "graphs")
        kind, key = graph_key(self.spec["run"], i)
        name = hashlib.sha256(f"{kind}\0{key}".encode()).hexdigest()
        return {"graphs": [i],
                **self._symlink_shard(os.path.join(self.blobs, "keys"), name[:2], True)}

    def lock_symlink(self) -> dict[str, Any]:
        (i,) = self._upcoming(1, "graphs")
        kind, key = graph_key(self.spec["run"], i)
        digest = graph_digest(self.spec["run"], i)
        name = hashlib.sha256(f"{kind}\0{key}".encode()).hexdigest()
        self.made += 1
        folder = os.path.join(self.spec["canary"], f"locks-{self.made}")
        os.makedirs(folder)
        files, planted = [], []
        for n, lock in enumerate([os.path.join(self.blobs, digest[:2], f"{digest}.lock"),
                                  os.path.join(self.blobs, "keys", name[:2], f"{name}.lock")]):
            if not self._real_dir(os.path.dirname(lock)):
                continue
            target = self._canary_file(folder, f"target-{n}", b"canary lock target\n", 0o640)
            tmp = f"{lock}.adv"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.symlink(target["path"], tmp)
            os.replace(tmp, lock)
            files.append(target)
            planted.append(lock)
        return {"graphs": [i], "canary": files, "canary_dirs": [folder], "variant": planted}

    def blob_fifo(self) -> dict[str, Any]:
        """Replace the blobs of the two latest graphs jobs are loading now with FIFOs no
        one writes."""
        from tunecache.store.blobs import DIGEST

        done: dict[str, Any] = {"graphs": [], "variant": []}
        for i in reversed(self._recent_graphs()):
            kind, key = graph_key(self.spec["run"], i)
            conn = sqlite3.connect(self.spec["url"].split("///", 1)[1], timeout=5)
            try:
                row = conn.execute("SELECT digest FROM tunecache_artifacts WHERE kind = ? "
                                   "AND cache_key = ?", (kind, key)).fetchone()
            finally:
                conn.close()
            if row is None or not isinstance(row[0], str) or not DIGEST.match(row[0]):
                continue
            shard = os.path.join(self.blobs, row[0][:2])
            if os.path.islink(shard) or not os.path.isdir(shard):
                continue
            tmp = os.path.join(shard, f".adv-fifo-{uuid.uuid4().hex}")
            os.mkfifo(tmp)
            os.replace(tmp, os.path.join(shard, row[0]))
            done["graphs"].append(i)
            done["variant"].append(row[0][:12])
            if len(done["graphs"]) == 2:
                break
        return done if done["graphs"] else {"skipped": "no published graph in the window yet"}


def run_adversary(spec: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    Adversary(spec).run()
