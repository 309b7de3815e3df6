"""Entries (claims, results, usage per key) and the usage log.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tunecache_entries",
        sa.Column("key_hash", sa.String(64), primary_key=True),
        sa.Column("key_json", sa.Text, nullable=False),
        sa.Column("kind", sa.String(256)),
        sa.Column("op", sa.String(256)),
        sa.Column("device", sa.String(256)),
        sa.Column("torch_version", sa.String(256)),
        sa.Column("triton_version", sa.String(256)),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(256)),
        sa.Column("token", sa.Integer, nullable=False),
        sa.Column("lease_expires_at", sa.Float),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("timings_json", sa.Text),
        sa.Column("best", sa.String(1024)),
        sa.Column("tune_seconds", sa.Float),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("last_used_at", sa.Float),
        sa.Column("hits", sa.Integer, nullable=False),
    )
    op.create_index("ix_tunecache_entries_state", "tunecache_entries", ["state"])
    op.create_index("ix_tunecache_entries_last_used_at", "tunecache_entries", ["last_used_at"])
    op.create_index(
        "ix_tunecache_entries_env",
        "tunecache_entries",
        ["device", "torch_version", "triton_version"],
    )
    op.create_table(
        "tunecache_usage",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("recorded_at", sa.Float, nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("hits", sa.Integer, nullable=False),
        sa.Column("tuned", sa.Integer, nullable=False),
        sa.Column("peer", sa.Integer, nullable=False),
        sa.Column("local", sa.Integer, nullable=False),
        sa.Column("seconds_saved", sa.Float, nullable=False),
        sa.Column("seconds_tuning", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tunecache_usage")
    op.drop_index("ix_tunecache_entries_env", "tunecache_entries")
    op.drop_index("ix_tunecache_entries_last_used_at", "tunecache_entries")
    op.drop_index("ix_tunecache_entries_state", "tunecache_entries")
    op.drop_table("tunecache_entries")
