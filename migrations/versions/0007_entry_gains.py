"""Entries carry what tuning bought as typed columns (tunecache.store.gains), so `tunecache
stats` sums them in SQL instead of parsing every entry's meta and timings. Existing done
entries get theirs here, read through the same function a writer uses.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from tunecache.keys import MAX_META_BYTES, MAX_TIMINGS_BYTES
from tunecache.store import columns, gains
from tunecache.store.schema import entries

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_PAGE = 2000


def upgrade() -> None:
    op.add_column("tunecache_entries", sa.Column("gain_state", sa.Integer))
    op.add_column("tunecache_entries", sa.Column("gain_baseline_ms", sa.Float))
    op.add_column("tunecache_entries", sa.Column("gain_best_ms", sa.Float))
    op.add_column("tunecache_entries", sa.Column("transfer_benchmarked", sa.Integer))
    op.add_column("tunecache_entries", sa.Column("transfer_generated", sa.Integer))
    op.add_column("tunecache_entries", sa.Column("transfer_regret", sa.Float))
    conn = op.get_bind()
    # Every done entry, as a writer would (one that stats need not read gets empty columns:
    # only rows no writer computed are left NULL). A text past a reader's limit comes back
    # NULL from the database, and the row reads as unreadable.
    page = (
        sa.select(entries.c.key_hash, entries.c.kind,
                  columns.bounded(entries.c.timings_json, MAX_TIMINGS_BYTES),
                  columns.bounded(entries.c.meta_json, MAX_META_BYTES))
        .where(entries.c.state == "done", entries.c.key_hash > sa.bindparam("p_after"))
        .order_by(entries.c.key_hash)
        .limit(_PAGE)
    )
    fill = (
        sa.update(entries)
        .where(entries.c.key_hash == sa.bindparam("p_key_hash"))
        .values(**gains.assignments())
    )
    after = ""
    while True:
        rows = conn.execute(page, {"p_after": after}).all()
        if not rows:
            break
        conn.execute(fill, [{"p_key_hash": r.key_hash,
                             **gains.params(r.kind, r.timings_json, r.meta_json)}
                            for r in rows])
        after = rows[-1].key_hash
    # After the fill, which would otherwise update the index row by row.
    op.create_index("ix_tunecache_entries_gains", "tunecache_entries",
                    ["state", "gain_state", "key_hash", "kind", "op", "gain_baseline_ms",
                     "gain_best_ms", "tune_seconds", "transfer_benchmarked",
                     "transfer_generated", "transfer_regret"])


def downgrade() -> None:
    op.drop_index("ix_tunecache_entries_gains", table_name="tunecache_entries")
    with op.batch_alter_table("tunecache_entries") as batch:
        for name in reversed(gains.COLUMNS):
            batch.drop_column(name)
