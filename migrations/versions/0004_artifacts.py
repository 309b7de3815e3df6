"""Compiled graphs: Inductor's FX graph and AOTAutograd cache entries, shared by jobs.

One row per (kind, key), first publish wins. On SQLite the payload is a content-addressed
file beside the database and the row holds its sha256 only; on PostgreSQL it is the
``payload`` column, stored out of line and not compressed again (STORAGE EXTERNAL: the
payload comes compressed, and PostgreSQL's pglz would spend CPU on every publish to gain
nothing), so statements that do not select it never read it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tunecache_artifacts",
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("cache_key", sa.String(512), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("signature", sa.LargeBinary, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("torch_version", sa.String(256)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_used_at", sa.Float),
        sa.Column("payload", sa.LargeBinary),
        sa.PrimaryKeyConstraint("kind", "cache_key", name="pk_tunecache_artifacts"),
    )
    op.create_index("ix_tunecache_artifacts_digest", "tunecache_artifacts", ["digest"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE tunecache_artifacts ALTER COLUMN payload SET STORAGE EXTERNAL")


def downgrade() -> None:
    # Blob files beside a SQLite database are left in place: `tunecache prune` of a
    # later upgrade removes them as orphans, and a downgrade must not destroy data it
    # cannot put back.
    op.drop_index("ix_tunecache_artifacts_digest", "tunecache_artifacts")
    op.drop_table("tunecache_artifacts")
