"""what a turn cost besides training and evaluating: checkpoint writes, and the set-up before a process's first turn

`benchmarks/study_efficiency.py` accounts for a study's time from these; both columns are nullable, so rows written
before stay valid.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 01:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

COLUMNS = ("checkpoint_seconds", "setup_seconds")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("lmt_turns", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    for name in COLUMNS:
        op.drop_column("lmt_turns", name)
