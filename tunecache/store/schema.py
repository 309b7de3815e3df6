"""The database schema, as SQLAlchemy Core tables. Alembic's revisions must produce exactly
this (tests/test_migrations.py compares a migrated database with it)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

__all__ = ["metadata", "entries", "usage", "artifacts", "STATES"]

metadata = MetaData()

# A key moves claimed -> done, or claimed -> failed; done is final. A claimed row whose lease
# has passed may be taken over (token + 1) by anyone.
STATES = ("claimed", "done", "failed")

entries = Table(
    "tunecache_entries",
    metadata,
    Column("key_hash", String(64), primary_key=True),
    Column("key_json", Text, nullable=False),
    # Copied out of the key (tunecache.keys.key_labels) so stats and prune can group and
    # filter without parsing JSON in SQL, which SQLite and PostgreSQL spell differently.
    Column("kind", String(256)),
    Column("op", String(256)),
    Column("device", String(256)),
    Column("torch_version", String(256)),
    Column("triton_version", String(256)),
    Column("state", String(16), nullable=False),
    Column("owner", String(256)),
    # Fencing token: bumped by every claim; a publish must present the current one.
    Column("token", Integer, nullable=False),
    Column("lease_expires_at", Float),
    # Claims of this key so far; past Settings.max_attempts the key is marked failed.
    Column("attempts", Integer, nullable=False),
    Column("timings_json", Text),
    Column("best", String(1024)),
    Column("tune_seconds", Float),
    Column("error", Text),
    # Times are seconds since the epoch, from the database where it has a clock of its own
    # (PostgreSQL) and from the host otherwise (SQLite runs inside the process).
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("last_used_at", Float),
    Column("hits", Integer, nullable=False),
    # The hash of the key's structure with its sizes left out (given by whoever built the
    # key, e.g. tunecache.inductor.transfer): a new key finds recorded keys of its family
    # to start from (migration 0006). NULL for keys that have none.
    Column("family", String(64)),
    # A JSON object beside the timings, validated on every read (keys.validate_meta):
    # the untuned choice's time, how the entry was found (transfer provenance), regret.
    Column("meta_json", Text),
    # What tuning bought, computed from meta (and a GEMM's timings) by whoever writes the
    # entry, so `tunecache stats` sums them in SQL (tunecache.store.gains; migration 0007).
    Column("gain_state", Integer),
    Column("gain_baseline_ms", Float),
    Column("gain_best_ms", Float),
    Column("transfer_benchmarked", Integer),
    Column("transfer_generated", Integer),
    Column("transfer_regret", Float),
    # Claims and failed keys (a few thousand at most) are found by state.
    Index("ix_tunecache_entries_state", "state"),
    # No index on last_used_at: prune filters on coalesce(last_used_at, updated_at),
    # which it cannot serve, and it cost every prune and hit (migration 0003).
    Index("ix_tunecache_entries_env", "device", "torch_version", "triton_version"),
    # Covers `tunecache stats` (migration 0002), so it never reads the wide rows.
    Index("ix_tunecache_entries_stats", "state", "kind", "op", "device", "torch_version",
          "triton_version", "hits", "tune_seconds"),
    # A new key's neighbours: done entries of one kind and family (migration 0006).
    Index("ix_tunecache_entries_family", "kind", "family"),
    # Covers stats' "what tuning bought" (store/stats_queries.py GAINS_GROUPS; migration 0007).
    Index("ix_tunecache_entries_gains", "state", "gain_state", "key_hash", "kind", "op",
          "gain_baseline_ms", "gain_best_ms", "tune_seconds", "transfer_benchmarked",
          "transfer_generated", "transfer_regret"),
)

# Usage is counted in memory and written in one row per flush (per compile or job), so a
# warm job's lookups stay reads.
usage = Table(
    "tunecache_usage",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("recorded_at", Float, nullable=False),
    Column("host", String(256), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("hits", Integer, nullable=False),
    Column("tuned", Integer, nullable=False),
    Column("peer", Integer, nullable=False),
    Column("local", Integer, nullable=False),
    Column("seconds_saved", Float, nullable=False),
    Column("seconds_tuning", Float, nullable=False),
)

# Compiled graphs (Inductor's FX graph and AOTAutograd cache entries), published once per
# (kind, key): the first publish wins and the row never changes but for last_used_at.
# On SQLite the payload lives in a content-addressed file beside the database
# (tunecache.store.blobs), so that megabytes are never written under the database's write
# lock, and ``payload`` stays NULL; on PostgreSQL it is this column, stored out of line
# and uncompressed (migration 0004: STORAGE EXTERNAL; the payload is compressed already),
# so stats, ls and prune, which never select it, never read it.
artifacts = Table(
    "tunecache_artifacts",
    metadata,
    Column("kind", String(32), nullable=False),
    Column("cache_key", String(512), nullable=False),
    Column("digest", String(64), nullable=False),  # sha256 hex of the payload
    Column("signature", LargeBinary, nullable=False),  # opaque to the store
    Column("size", BigInteger, nullable=False),
    Column("torch_version", String(256)),
    Column("created_at", Float, nullable=False),
    # Set on publish; then a job's loads are counted in memory and written with its usage
    # counters (hits added, last_used_at the time of the last load), so reads stay reads.
    Column("last_used_at", Float),
    Column("payload", LargeBinary),
    Column("hits", Integer, nullable=False, server_default="0"),
    PrimaryKeyConstraint("kind", "cache_key", name="pk_tunecache_artifacts"),
    # Whether a blob is still referenced, when a prune deletes rows.
    Index("ix_tunecache_artifacts_digest", "digest"),
)
