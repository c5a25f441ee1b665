"""project tables

Revision ID: 0001
Revises:
Create Date: 2026-11-22 22:25:14.783282
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lmt_api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
        sa.UniqueConstraint("token_sha256"),
    )
    op.create_table(
        "lmt_checkpoints",
        sa.Column("trial_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("path", sa.String(length=512), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("val_loss", sa.Float(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("trial_id"),
    )
    op.create_table(
        "lmt_evaluations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("valid_loss", sa.Float(), nullable=False),
        sa.Column("test_loss", sa.Float(), nullable=False),
        sa.Column("logit_scale", sa.Float(), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("dyneval_trial_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("trial_id", "kind"),
    )
    with op.batch_alter_table("lmt_evaluations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_lmt_evaluations_trial_id"), ["trial_id"], unique=False)

    op.create_table(
        "lmt_studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("families", sa.String(length=256), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("submitted_via", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("controller", sa.String(length=128), nullable=True),
        sa.Column("best_possible_loss", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    with op.batch_alter_table("lmt_studies", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_lmt_studies_status"), ["status"], unique=False)

    op.create_table(
        "lmt_trials",
        sa.Column("trial_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("study_name", sa.String(length=64), nullable=False),
        sa.Column("family", sa.String(length=32), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("parent_trial_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("hidden_size", sa.Integer(), nullable=True),
        sa.Column("parameter_count", sa.Integer(), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("fail_reason", sa.Text(), nullable=True),
        sa.Column("interrupted", sa.Boolean(), nullable=False),
        sa.Column("turns_reported", sa.Integer(), nullable=False),
        sa.Column("wall_seconds", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("trial_id"),
    )
    with op.batch_alter_table("lmt_trials", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_lmt_trials_study_name"), ["study_name"], unique=False)
        batch_op.create_index("ix_lmt_trials_study_state", ["study_name", "state"], unique=False)
        batch_op.create_index("ix_lmt_trials_study_value", ["study_name", "value"], unique=False)

    op.create_table(
        "lmt_turns",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("train_loss", sa.Float(), nullable=False),
        sa.Column("val_loss", sa.Float(), nullable=False),
        sa.Column("best_val_loss", sa.Float(), nullable=False),
        sa.Column("tokens_per_second", sa.Float(), nullable=False),
        sa.Column("wall_seconds", sa.Float(), nullable=False),
        sa.Column("process_seconds", sa.Float(), nullable=True),
        sa.Column("averaging_length", sa.Integer(), nullable=True),
        sa.Column("learning_rate", sa.Float(), nullable=True),
        sa.Column("epochs", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("trial_id", "turn"),
    )
    with op.batch_alter_table("lmt_turns", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_lmt_turns_trial_id"), ["trial_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("lmt_turns", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_lmt_turns_trial_id"))

    op.drop_table("lmt_turns")
    with op.batch_alter_table("lmt_trials", schema=None) as batch_op:
        batch_op.drop_index("ix_lmt_trials_study_value")
        batch_op.drop_index("ix_lmt_trials_study_state")
        batch_op.drop_index(batch_op.f("ix_lmt_trials_study_name"))

    op.drop_table("lmt_trials")
    with op.batch_alter_table("lmt_studies", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_lmt_studies_status"))

    op.drop_table("lmt_studies")
    with op.batch_alter_table("lmt_evaluations", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_lmt_evaluations_trial_id"))

    op.drop_table("lmt_evaluations")
    op.drop_table("lmt_checkpoints")
    op.drop_table("lmt_api_tokens")
