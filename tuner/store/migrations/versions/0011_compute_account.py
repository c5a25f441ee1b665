"""a study's compute as one account: every turn and trial records the training tokens and the device-seconds (CPU
core-seconds or GPU-seconds) used so far, and when the turn was recorded; a study with a compute budget records the
plan its rungs follow (fixed when it first runs, so that a continued study keeps its rungs). Nullable: rows written
before are unknown.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 00:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("lmt_turns", sa.Column("tokens", sa.BigInteger(), nullable=True))
    op.add_column("lmt_turns", sa.Column("compute_seconds", sa.Float(), nullable=True))
    op.add_column("lmt_turns", sa.Column("reported_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("lmt_trials", sa.Column("tokens", sa.BigInteger(), nullable=True))
    op.add_column("lmt_trials", sa.Column("compute_seconds", sa.Float(), nullable=True))
    op.add_column("lmt_studies", sa.Column("plan", sa.JSON(), nullable=True))


def downgrade() -> None:
    for table, column in (("lmt_studies", "plan"), ("lmt_trials", "compute_seconds"), ("lmt_trials", "tokens"),
                          ("lmt_turns", "reported_at"), ("lmt_turns", "compute_seconds"), ("lmt_turns", "tokens")):
        op.drop_column(table, column)
