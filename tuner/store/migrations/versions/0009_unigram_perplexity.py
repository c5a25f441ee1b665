"""the unigram baseline of a study's corpus, stored once the corpus has been read (by the process that ran the
study, or the API that checked it), so that reports no longer read the corpus to show it: seconds for every
`tuner status`, and every study of a dashboard page, on a corpus of 100 MB. Nullable: null until then.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 20:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("lmt_studies", sa.Column("unigram_perplexity", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("lmt_studies", "unigram_perplexity")
