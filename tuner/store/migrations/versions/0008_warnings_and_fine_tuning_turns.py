"""what a study's run warned about (evaluation taking most of each trial, ...), kept with the study so that
`tuner status` and `GET /studies/{name}` show it whoever ran the study; and which turns belong to the fine-tuning
stage (training.fine_tuning). Nullable: studies and turns stored before have none.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 05:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("lmt_studies", sa.Column("warnings", sa.JSON(), nullable=True))
    op.add_column("lmt_turns", sa.Column("fine_tuning", sa.Boolean(), nullable=True))


def downgrade() -> None:
    op.drop_column("lmt_turns", "fine_tuning")
    op.drop_column("lmt_studies", "warnings")
