"""an index of the trials progress reads beyond the counters

A study's progress needs its trials of later stages (reruns, dynamic evaluation) and its interrupted
tuning trials, which the tuning counters of 0002 do not tell apart. Without an index that read scanned
all of a study's trials (0.6 ms at 5,000 on PostgreSQL, growing with them); this partial index holds
only those rows, a few per study.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 17:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

BEYOND_TUNING = sa.text("(stage <> 'tune' OR interrupted)")


def upgrade() -> None:
    op.create_index("ix_lmt_trials_beyond_tuning", "lmt_trials", ["study_name"], postgresql_where=BEYOND_TUNING,
                    sqlite_where=BEYOND_TUNING)


def downgrade() -> None:
    op.drop_index("ix_lmt_trials_beyond_tuning", "lmt_trials")
