"""service settings: whether the API requires tokens is an explicit state

Authentication used to be inferred from the tokens: on while an active token existed, so revoking the
last token opened the API again. It is now a row of `lmt_settings` that only `tuner token create`
(on) and `tuner auth off` change. A database with an active token starts with authentication on.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 16:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lmt_settings",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.String(length=256), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.execute("INSERT INTO lmt_settings (key, value, updated_at) SELECT 'auth', 'on', CURRENT_TIMESTAMP "
               "WHERE EXISTS (SELECT 1 FROM lmt_api_tokens WHERE revoked_at IS NULL)")


def downgrade() -> None:
    op.drop_table("lmt_settings")
