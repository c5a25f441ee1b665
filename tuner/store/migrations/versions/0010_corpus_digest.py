"""the digest of a study's tokens (vocabulary and streams), recorded when its controller first reads its corpus, so
that a study continued on other data (files changed since, read another way, or other files at the same path on
another machine) is refused instead of mixing trials of two corpora. Nullable: null until then.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 12:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("lmt_studies", sa.Column("corpus_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("lmt_studies", "corpus_digest")
