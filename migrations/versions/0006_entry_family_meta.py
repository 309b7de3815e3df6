"""Entries carry a family (the hash of a key's structure with its sizes left out, so that a
new key can find recorded keys of the same structure) and a meta object (what tuning bought
and how the entry was found: the untuned choice's time, transfer provenance, regret).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tunecache_entries", sa.Column("family", sa.String(64)))
    op.add_column("tunecache_entries", sa.Column("meta_json", sa.Text))
    op.create_index("ix_tunecache_entries_family", "tunecache_entries", ["kind", "family"])


def downgrade() -> None:
    op.drop_index("ix_tunecache_entries_family", table_name="tunecache_entries")
    with op.batch_alter_table("tunecache_entries") as batch:
        batch.drop_column("meta_json")
        batch.drop_column("family")
