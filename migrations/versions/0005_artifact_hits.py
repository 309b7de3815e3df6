"""Compiled graphs count their loads, as entries count their hits, so that `stats` and
`ls --graphs` show graph reuse.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tunecache_artifacts",
                  sa.Column("hits", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("tunecache_artifacts") as batch:
        batch.drop_column("hits")
