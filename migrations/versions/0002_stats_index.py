"""A covering index for `tunecache stats`.

stats groups every entry by state, kind, op and environment and sums hits and tuning
seconds. Without this index SQLite reads the whole table, whose rows (key JSON and timings)
fill a page each: 6.9 s at a million entries on the dev VM, 1.0 s with it
(tools/bench_admin.py, docs/benchmarks.md).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = ["state", "kind", "op", "device", "torch_version", "triton_version", "hits",
           "tune_seconds"]


def upgrade() -> None:
    op.create_index("ix_tunecache_entries_stats", "tunecache_entries", COLUMNS)


def downgrade() -> None:
    op.drop_index("ix_tunecache_entries_stats", "tunecache_entries")
