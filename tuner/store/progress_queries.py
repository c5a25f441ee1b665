"""A study's progress per stage, counted in SQL: settled and running trials against the plan, and the ETA of the
current stage from its finished trials' mean duration (a compute-budgeted study's tuning: from the tokens its rungs
still lack)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from functools import cache, partial

from sqlalchemy import Select, and_, bindparam, func, select

from lm_tuner.tuner.store.optuna_internals import TRIALS as _trials
from lm_tuner.tuner.store.progress import (
    STAGE_LABELS,
    StageProgress,
    StageTally,
    StudyProgress,
    budgeted_seconds_left,
    estimated_seconds_left,
    planned_stages,
)
from lm_tuner.tuner.store.schema import (
    BEYOND_TUNING,
    StudyRecord,
    TrialRecord,
)
from lm_tuner.tuner.store.views import SETTLED_STATES


def read_progress(connection, rows) -> dict[str, StudyProgress]:
    """The progress of each study in `rows`. Tuning trials are counted by the triggers' counters (in the
    rows), less the interrupted ones; one query reads those and the later stages' trials, and a study
    queries again only where a later stage's plan depends on its complete tuning trials, or for its ETA."""
    later: dict[str, dict[tuple[str, str], StageTally]] = {row.name: {} for row in rows}
    interrupted = dict.fromkeys(later, 0)
    if rows:
        for found in connection.execute(_tally_query(), {"names": list(later)}):
            if found.stage == "tune":
                interrupted[found.study_name] += found.interrupted
            else:
                later[found.study_name][found.stage, found.family] = StageTally(found.settled, found.running,
                                                                                found.complete)
    progress = {}
    for row in rows:
        tuning = StageTally(row.count_COMPLETE + row.count_PRUNED + row.count_FAIL - interrupted[row.name],
                            row.count_RUNNING)
        stages = planned_stages(row.spec, tuning, later[row.name], partial(_complete_tuning, connection, row.name))
        found = StudyProgress(tuple(stages))
        current = found.current
        if row.status == "running" and current is not None:
            timed = replace(current, eta_seconds=_stage_eta(connection, row, current))
            found = StudyProgress(tuple(timed if stage is current else stage for stage in found.stages))
        progress[row.name] = found
    return progress


def _stage_eta(connection, row, stage: StageProgress) -> float | None:
    values = {"name": row.name, "stage": stage.stage}
    if stage.stage == "tune" and row.spec.get("compute_budget"):
        plan = connection.scalar(_plan_query(), values)
        if plan is not None:  # stored when the study first ran
            trained = {found.family: (float(found.tokens), float(found.seconds))
                       for found in connection.execute(_trained_query(), values)}
            return budgeted_seconds_left(plan, trained)
    mean = connection.scalar(_mean_duration_query(connection.dialect.name), values)
    now = datetime.now()  # naive local time, as Optuna writes its timestamps
    running_elapsed = [(now - start).total_seconds() for start in connection.scalars(_running_starts_query(), values)]
    remaining = max(stage.planned - stage.settled - stage.running, 0)
    return estimated_seconds_left(None if mean is None else float(mean), running_elapsed, remaining,
                                  row.spec["tuning"]["concurrency"])


@cache
def _tally_query() -> Select:
    """What the tuning counters leave out, per study, stage and family: the trials of the later stages
    (settled as the controller counts them, running, complete), and the interrupted tuning trials, which the
    counters count as failed."""
    interrupted = TrialRecord.interrupted.is_(True)
    settled = and_(TrialRecord.state.in_(SETTLED_STATES), TrialRecord.interrupted.is_(False))
    return (select(TrialRecord.study_name, TrialRecord.stage, TrialRecord.family,
                   func.count().filter(settled).label("settled"),
                   func.count().filter(TrialRecord.state == "RUNNING").label("running"),
                   func.count().filter(TrialRecord.state == "COMPLETE").label("complete"),
                   func.count().filter(interrupted, TrialRecord.state.in_(SETTLED_STATES)).label("interrupted"))
            .where(TrialRecord.study_name.in_(bindparam("names", expanding=True)),
                   TrialRecord.stage.in_(STAGE_LABELS), BEYOND_TUNING)  # as its partial index says it
            .group_by(TrialRecord.study_name, TrialRecord.stage, TrialRecord.family))


def _complete_tuning(connection, name: str, family: str, most: int) -> int:
    return connection.scalar(_complete_tuning_query(), {"name": name, "family": family, "most": most})


@cache
def _complete_tuning_query() -> Select:
    """A family's complete tuning trials, counted up to `most` (the index on state stops the scan there)."""
    found = (select(TrialRecord.trial_id)
             .where(TrialRecord.study_name == bindparam("name"), TrialRecord.state == "COMPLETE",
                    TrialRecord.family == bindparam("family"), TrialRecord.stage == "tune")
             .limit(bindparam("most")).subquery())
    return select(func.count()).select_from(found)


@cache
def _mean_duration_query(dialect: str) -> Select:
    """The mean duration in seconds of the settled trials of one stage of a study (None if there is none)."""
    start, end = _trials.c.datetime_start, _trials.c.datetime_complete
    seconds = ((func.julianday(end) - func.julianday(start)) * 86400.0 if dialect == "sqlite"
               else func.extract("epoch", end - start))
    return (select(func.avg(seconds)).join_from(TrialRecord, _trials, _trials.c.trial_id == TrialRecord.trial_id)
            .where(TrialRecord.study_name == bindparam("name"), TrialRecord.stage == bindparam("stage"),
                   TrialRecord.state.in_(SETTLED_STATES), TrialRecord.interrupted.is_(False)))


@cache
def _plan_query() -> Select:
    return select(StudyRecord.plan).where(StudyRecord.name == bindparam("name"))


@cache
def _trained_query() -> Select:
    """Per family, the training tokens a stage's trials have reported and the wall-clock seconds they took."""
    return (select(TrialRecord.family, func.sum(TrialRecord.tokens).label("tokens"),
                   func.sum(TrialRecord.wall_seconds).label("seconds"))
            .where(TrialRecord.study_name == bindparam("name"), TrialRecord.stage == bindparam("stage"),
                   TrialRecord.tokens.is_not(None), TrialRecord.wall_seconds.is_not(None))
            .group_by(TrialRecord.family))


@cache
def _running_starts_query() -> Select:
    return (select(_trials.c.datetime_start).join_from(TrialRecord, _trials, _trials.c.trial_id == TrialRecord.trial_id)
            .where(TrialRecord.study_name == bindparam("name"), TrialRecord.stage == bindparam("stage"),
                   TrialRecord.state == "RUNNING"))
