"""what evaluation costs and covers, per turn and per trial; where a study's artifacts are

Scoring the whole validation split after every turn can cost more than the training itself, so a schedule
may score only its first `validation_tokens` tokens. Each turn now records the seconds it spent training and
evaluating and how many validation tokens its loss covers (and whether those are a subset of the split);
each trial the same summed over its turns, and, where it was tuned on a subset, the loss of its best
checkpoint on the whole split (`full_value`). Studies get `artifact_root`, the artifact store their
checkpoints were written to. Every column is nullable: rows written before stay valid.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 19:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

PER_TURN = (("train_seconds", sa.Float), ("eval_seconds", sa.Float), ("val_tokens", sa.Integer),
            ("val_subset", sa.Boolean))
COLUMNS = {
    "lmt_turns": PER_TURN,
    "lmt_trials": (*PER_TURN, ("full_value", sa.Float)),
    "lmt_studies": (("artifact_root", sa.Text),),
}


def upgrade() -> None:
    for table, columns in COLUMNS.items():
        for name, kind in columns:
            op.add_column(table, sa.Column(name, kind(), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35): batch mode would rebuild lmt_trials without 0002's triggers.
    for table, columns in COLUMNS.items():
        for name, _ in columns:
            op.drop_column(table, name)
