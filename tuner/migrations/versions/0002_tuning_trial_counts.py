"""tuning trial counts kept on the study row

Listing studies counted each study's tuning trials per state on every request: a scan of all its
trials (0.5 ms of the request at 5,000 trials, and growing with them). The counts now live in
`lmt_studies`, kept by triggers on `lmt_trials`, so every writer (this project's ledger, a bulk
import, a manual fix) keeps them right, and a list reads them like any other column.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 08:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

STATES = ("COMPLETE", "RUNNING", "PRUNED", "FAIL", "WAITING")  # Optuna's trial states, frozen here
TUNING = "'tune'"
TRIGGERS = ("lmt_trials_counted_insert", "lmt_trials_counted_update", "lmt_trials_counted_delete")


def column(state: str) -> str:
    return f"tuning_{state.lower()}"


def adjust(row: str, sign: str) -> str:
    """SET clauses adding `sign` 1 to the counter of `row`'s state when `row` is a tuning trial."""
    return ", ".join(f"{column(s)} = {column(s)} {sign} CASE WHEN {row}.stage = {TUNING} AND {row}.state = '{s}' "
                     f"THEN 1 ELSE 0 END" for s in STATES)


def count_of(row: str, sign: str) -> str:
    return f"UPDATE lmt_studies SET {adjust(row, sign)} WHERE name = {row}.study_name"


def upgrade() -> None:
    with op.batch_alter_table("lmt_studies", schema=None) as batch_op:
        for state in STATES:
            batch_op.add_column(sa.Column(column(state), sa.Integer(), server_default="0", nullable=False))
    op.execute("UPDATE lmt_studies SET " + ", ".join(
        f"{column(s)} = (SELECT count(*) FROM lmt_trials WHERE lmt_trials.study_name = lmt_studies.name "
        f"AND lmt_trials.stage = {TUNING} AND lmt_trials.state = '{s}')" for s in STATES))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"""
            CREATE FUNCTION lmt_count_tuning_trials() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP <> 'INSERT' THEN {count_of("OLD", "-")}; END IF;
                IF TG_OP <> 'DELETE' THEN {count_of("NEW", "+")}; END IF;
                RETURN NULL;
            END $$""")
        op.execute("""CREATE TRIGGER lmt_trials_counted AFTER INSERT OR DELETE OR UPDATE OF study_name, stage, state
                      ON lmt_trials FOR EACH ROW EXECUTE FUNCTION lmt_count_tuning_trials()""")
    else:
        op.execute(f"CREATE TRIGGER lmt_trials_counted_insert AFTER INSERT ON lmt_trials "
                   f"BEGIN {count_of('NEW', '+')}; END")
        op.execute(f"CREATE TRIGGER lmt_trials_counted_update AFTER UPDATE OF study_name, stage, state ON lmt_trials "
                   f"BEGIN {count_of('OLD', '-')}; {count_of('NEW', '+')}; END")
        op.execute(f"CREATE TRIGGER lmt_trials_counted_delete AFTER DELETE ON lmt_trials "
                   f"BEGIN {count_of('OLD', '-')}; END")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER lmt_trials_counted ON lmt_trials")
        op.execute("DROP FUNCTION lmt_count_tuning_trials()")
    else:
        for trigger in TRIGGERS:
            op.execute(f"DROP TRIGGER {trigger}")
    with op.batch_alter_table("lmt_studies", schema=None) as batch_op:
        for state in STATES:
            batch_op.drop_column(column(state))
