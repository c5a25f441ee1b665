"""what a turn's evaluation measured beyond the loss: the reverse-copy task's reversed half, the softmax temperature

On the reverse-copy task only the reversed half of each example measures memory (the first half is unpredictable),
so each turn records the loss and the accuracy on the reversed halves next to the all-token loss, and each trial
the values of its best turn. Each turn also records the logit scale (1 / softmax temperature) its validation loss
was scored at. Every column is nullable: rows written before stay valid.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 22:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

REVERSED_HALF = (("reversed_loss", sa.Float), ("reversed_accuracy", sa.Float))
COLUMNS = {
    "lmt_turns": (*REVERSED_HALF, ("val_logit_scale", sa.Float)),
    "lmt_trials": REVERSED_HALF,
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
