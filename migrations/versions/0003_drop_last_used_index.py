"""Drop the index on last_used_at: no query uses it, and every prune and hit pays for it.

prune --older-than selects on ``coalesce(last_used_at, updated_at)`` (an entry never used
since it was tuned ages from its update), which neither SQLite nor PostgreSQL can answer
from an index on ``last_used_at`` alone; nothing else filters or sorts on it (EXPLAIN
QUERY PLAN of every statement of tunecache.store, 2026-11-30). Yet a deleted row's entry
sits at a random place of that index with respect to the prune's rowid walk, so each
batch rewrote a few thousand of its pages: pruning half of 1M entries without it took
34.9 s instead of 38.7 s (SQLite, no traffic; tools/bench_admin.py, docs/benchmarks.md).
Each flush of hits (which sets last_used_at) also updated it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_tunecache_entries_last_used_at", "tunecache_entries")


def downgrade() -> None:
    op.create_index("ix_tunecache_entries_last_used_at", "tunecache_entries", ["last_used_at"])
