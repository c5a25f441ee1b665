"""tuning trial counts kept per study

Listing studies counted each study's tuning trials per state on every request: a scan of all its
trials (0.5 ms of the request at 5,000 trials, and growing with them). The counts now live in
`lmt_trial_counts`, one narrow row per study kept by triggers on `lmt_trials`, so every writer (this
project's ledger, a bulk import, a manual fix) keeps them right and a list joins them by key. (On the
wide study row itself, every trial written rewrote its spec and document.)

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
TRIGGERS = ("lmt_trials_counted_insert", "lmt_trials_counted_update", "lmt_trials_counted_delete")
COUNTERS = [f"tuning_{state.lower()}" for state in STATES]


def add(row: str, sign: str) -> str:
    """An upsert adding `sign` 1 to the counter of `row`'s state, when `row` is a tuning trial."""
    deltas = ", ".join(f"{sign}CASE WHEN {row}.stage = 'tune' AND {row}.state = '{state}' THEN 1 ELSE 0 END"
                       for state in STATES)
    sums = ", ".join(f"{c} = lmt_trial_counts.{c} + excluded.{c}" for c in COUNTERS)
    return (f"INSERT INTO lmt_trial_counts (study_name, {', '.join(COUNTERS)}) VALUES ({row}.study_name, {deltas}) "
            f"ON CONFLICT (study_name) DO UPDATE SET {sums}")


def upgrade() -> None:
    op.create_table(
        "lmt_trial_counts",
        sa.Column("study_name", sa.String(length=64), nullable=False),
        *(sa.Column(c, sa.Integer(), server_default="0", nullable=False) for c in COUNTERS),
        sa.PrimaryKeyConstraint("study_name"),
    )
    op.execute(f"INSERT INTO lmt_trial_counts (study_name, {', '.join(COUNTERS)}) SELECT study_name, " + ", ".join(
        f"sum(CASE WHEN stage = 'tune' AND state = '{state}' THEN 1 ELSE 0 END)" for state in STATES)
        + " FROM lmt_trials GROUP BY study_name")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"""
            CREATE FUNCTION lmt_count_tuning_trials() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP <> 'INSERT' THEN {add("OLD", "-")}; END IF;
                IF TG_OP <> 'DELETE' THEN {add("NEW", "")}; END IF;
                RETURN NULL;
            END $$""")
        op.execute("""CREATE TRIGGER lmt_trials_counted AFTER INSERT OR DELETE OR UPDATE OF study_name, stage, state
                      ON lmt_trials FOR EACH ROW EXECUTE FUNCTION lmt_count_tuning_trials()""")
    else:
        op.execute(f"CREATE TRIGGER lmt_trials_counted_insert AFTER INSERT ON lmt_trials BEGIN {add('NEW', '')}; END")
        op.execute(f"CREATE TRIGGER lmt_trials_counted_update AFTER UPDATE OF study_name, stage, state ON lmt_trials "
                   f"BEGIN {add('OLD', '-')}; {add('NEW', '')}; END")
        op.execute(f"CREATE TRIGGER lmt_trials_counted_delete AFTER DELETE ON lmt_trials BEGIN {add('OLD', '-')}; END")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER lmt_trials_counted ON lmt_trials")
        op.execute("DROP FUNCTION lmt_count_tuning_trials()")
    else:
        for trigger in TRIGGERS:
            op.execute(f"DROP TRIGGER {trigger}")
    op.drop_table("lmt_trial_counts")
