"""Read models of studies and trials, queried from Optuna's tables and the project's own in SQL.

The CLI, the API and the dashboard read through here, so they always agree. Every query is paged
or aggregated in the database: a study of thousands of trials is never loaded whole to answer one
page.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cache, lru_cache, partial
from typing import Any, Generic, Literal, TypeVar

import numpy as np
import pandas as pd
from optuna.distributions import json_to_distribution
from optuna.storages._rdb.models import (  # Optuna's own table definitions, so queries follow its schema
    TrialModel,
    TrialParamModel,
    TrialUserAttributeModel,
)
from sqlalchemy import Select, and_, bindparam, func, select

from lm_tuner.tuner.db import (
    BEYOND_TUNING,
    CheckpointRecord,
    StudyRecord,
    TrialCountRecord,
    TrialRecord,
    TurnRecord,
    reading,
    retried_on_disconnect,
    sessions,
)
from lm_tuner.tuner.study_progress import (
    STAGE_LABELS,
    StageProgress,
    StageTally,
    StudyProgress,
    estimated_seconds_left,
    planned_stages,
)

TRIAL_STATES = ("COMPLETE", "RUNNING", "PRUNED", "FAIL", "WAITING")
TRIAL_SORTS = ("number", "value", "family", "state", "started")
SETTLED_STATES = ("COMPLETE", "PRUNED", "FAIL")

_trials = TrialModel.__table__
_params = TrialParamModel.__table__
_user_attributes = TrialUserAttributeModel.__table__

Item = TypeVar("Item")


@dataclass(frozen=True)
class Page(Generic[Item]):
    items: list[Item]
    total: int
    limit: int | None
    offset: int


@dataclass(frozen=True)
class CheckpointView:
    path: str
    size_bytes: int
    sha256: str
    val_loss: float
    turn: int


@dataclass(frozen=True)
class TrialView:
    trial_id: int
    study: str
    family: str
    stage: str  # tune, rerun or dyneval
    parent_trial_id: int | None  # what a rerun repeats, or whose checkpoint a stage-2 trial adapts
    number: int
    state: str
    value: float | None  # best validation cross-entropy, nats/token (COMPLETE trials only)
    params: dict[str, Any]
    hidden_size: int | None
    parameter_count: int | None
    seed: int | None
    fail_reason: str | None
    turns_reported: int
    wall_seconds: float | None
    last_value: float | None
    checkpoint: CheckpointView | None
    started_at: datetime | None
    finished_at: datetime | None

    @property
    def perplexity(self) -> float | None:
        return None if self.value is None else math.exp(self.value)


@dataclass(frozen=True)
class StudyView:
    name: str
    status: str
    description: str
    families: list[str]
    parameter_budget: int
    trials_per_family: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    best_possible_loss: float | None
    spec: dict[str, Any]
    progress: StudyProgress
    counts: dict[str, int] = field(default_factory=dict)  # tuning trials by state
    best: TrialView | None = None

    @property
    def trials_expected(self) -> int:
        """Trials of every stage the spec asks for."""
        return self.progress.planned

    @property
    def trials_finished(self) -> int:
        """Trials that count against the plan (never more than `trials_expected`)."""
        return self.progress.settled

    @property
    def best_possible_perplexity(self) -> float | None:
        return None if self.best_possible_loss is None else math.exp(self.best_possible_loss)


@retried_on_disconnect
def list_studies(url: str, *, status: str | None = None, family: str | None = None, name_contains: str | None = None,
                 limit: int | None = None, offset: int = 0) -> Page[StudyView]:
    """Studies, newest first, filtered and paged in the database: two queries whatever the page size."""
    values = {"status": status, "family": family and _containing(f",{family},"),
              "name": name_contains and _containing(name_contains), "limit": limit, "offset": offset}
    query, count = _study_page_queries(bool(status), bool(family), bool(name_contains), limit is not None)
    with reading(url) as connection:
        rows = connection.execute(query, values).all()
        total = rows[0].total if rows else connection.scalar(count, values)
        best = _best_views(connection, rows)
        progress = _progress(connection, rows)
    return Page([_study_view(row, best.get(row.best_trial_id), progress[row.name]) for row in rows], total, limit,
                offset)


def _containing(text: str) -> str:
    """A LIKE pattern (escape character /) matching values that contain `text` literally."""
    return "%" + text.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"


@cache
def _study_page_queries(by_status: bool, by_family: bool, by_name: bool, limited: bool) -> tuple[Select, Select]:
    """The page and the count statements for one combination of filters, their values bound at execution."""
    filters = []
    if by_status:
        filters.append(StudyRecord.status == bindparam("status"))
    if by_family:
        filters.append(StudyRecord.families.like(bindparam("family"), escape="/"))
    if by_name:
        filters.append(StudyRecord.name.like(bindparam("name"), escape="/"))
    page = (_summary_query().add_columns(func.count().over().label("total")).where(*filters)
            .order_by(StudyRecord.created_at.desc(), StudyRecord.id.desc()).offset(bindparam("offset")))
    if limited:
        page = page.limit(bindparam("limit"))
    return page, select(func.count()).select_from(StudyRecord).where(*filters)


def study_families(url: str) -> list[str]:
    """Every family some study compares, sorted (for filters)."""
    with sessions(url)() as session:
        stored = session.scalars(select(StudyRecord.families).distinct()).all()
    return sorted({family for families in stored for family in families.strip(",").split(",") if family})


def study_exists(url: str, name: str) -> bool:
    with sessions(url)() as session:
        return session.scalar(select(StudyRecord.id).where(StudyRecord.name == name)) is not None


@retried_on_disconnect
def get_study(url: str, name: str) -> StudyView | None:
    with reading(url) as connection:
        row = connection.execute(_study_query(), {"name": name}).first()
        if row is None:
            return None
        best = _best_views(connection, [row])
        progress = _progress(connection, [row])
    return _study_view(row, best.get(row.best_trial_id), progress[row.name])


@retried_on_disconnect
def study_trials(
    url: str,
    name: str,
    *,
    state: str | None = None,
    family: str | None = None,
    stage: str | None = None,
    sort: Literal["number", "value", "family", "state", "started"] = "number",
    descending: bool = False,
    limit: int | None = None,
    offset: int = 0,
) -> Page[TrialView]:
    """A study's trials, filtered, sorted and paged in the database (limit None: all of them)."""
    filters = [TrialRecord.study_name == name]
    if state:
        filters.append(TrialRecord.state == state)
    if family:
        filters.append(TrialRecord.family == family)
    if stage:
        filters.append(TrialRecord.stage == stage)
    order = {
        "number": [TrialRecord.family, TrialRecord.stage != "tune", TrialRecord.stage, TrialRecord.number],
        "value": [TrialRecord.value.is_(None), TrialRecord.value],  # unfinished trials last
        "family": [TrialRecord.family, TrialRecord.stage != "tune", TrialRecord.stage, TrialRecord.number],
        "state": [TrialRecord.state, TrialRecord.family, TrialRecord.number],
        "started": [_trials.c.datetime_start],
    }[sort]
    if descending:
        order = [column.desc() for column in order]
    with reading(url) as connection:
        total = connection.scalar(select(func.count()).select_from(TrialRecord).where(*filters))
        rows = connection.execute(_trial_query().where(*filters).order_by(*order, TrialRecord.trial_id)
                                  .limit(limit).offset(offset)).all()
        views = _trial_views(connection, rows)
    return Page(views, total, limit, offset)


@retried_on_disconnect
def get_trial(url: str, trial_id: int) -> TrialView | None:
    with reading(url) as connection:
        views = _trials_by_id(connection, [trial_id])
    return views[0] if views else None


@retried_on_disconnect
def pareto_frame(url: str, name: str) -> pd.DataFrame:
    """Complete trials with what a Pareto plot can put on its axes (no hyperparameters loaded)."""
    with reading(url) as connection:  # Core rows: no ORM bookkeeping for thousands of trials
        spec = connection.scalar(select(StudyRecord.spec).where(StudyRecord.name == name)) or {}
        rows = connection.execute(
            select(TrialRecord.trial_id, TrialRecord.family, TrialRecord.number, TrialRecord.value,
                   TrialRecord.parameter_count, TrialRecord.wall_seconds)
            .where(TrialRecord.study_name == name, TrialRecord.stage == "tune", TrialRecord.state == "COMPLETE")
        )
        rows = [tuple(row) for row in rows]  # plain tuples: pandas probes Row objects slowly
    frame = pd.DataFrame(rows, columns=["trial_id", "family", "number", "value", "parameter_count", "wall_seconds"])
    frame["perplexity"] = np.exp(frame["value"].astype(float))
    gpus_per_trial = spec.get("resources", {}).get("gpus_per_trial", 0.0)
    frame["gpu_seconds"] = frame["wall_seconds"] * gpus_per_trial  # GPU time reserved for the trial
    return frame


def trials_frame(trials: list[TrialView]) -> pd.DataFrame:
    """One row per trial with the columns the figures plot."""
    columns = ["trial_id", "family", "number", "state", "value", "perplexity", "parameter_count", "hidden_size",
               "wall_seconds"]
    return pd.DataFrame([{name: getattr(trial, name) for name in columns} for trial in trials], columns=columns)


def trials_table(trials: list[TrialView]) -> pd.DataFrame:
    """Everything about each trial in flat columns (hyperparameters prefixed `param.`), for export."""
    rows = []
    for trial in trials:
        row = {name: getattr(trial, name) for name in (
            "trial_id", "family", "stage", "parent_trial_id", "number", "state", "value", "perplexity", "last_value",
            "parameter_count", "hidden_size", "seed", "turns_reported", "wall_seconds", "started_at", "finished_at",
            "fail_reason")}
        row |= {f"param.{key}": value for key, value in trial.params.items()}
        row["checkpoint"] = trial.checkpoint.path if trial.checkpoint else None
        rows.append(row)
    return pd.DataFrame(rows)


def family_counts(url: str, name: str) -> dict[str, dict[str, int]]:
    """Trials per state for each family of a study (every state present, zeros included)."""
    with sessions(url)() as session:
        families = session.scalar(select(StudyRecord.spec).where(StudyRecord.name == name))["families"]
        counts = {family: dict.fromkeys(TRIAL_STATES, 0) for family in families}
        for family, state, count in session.execute(
                select(TrialRecord.family, TrialRecord.state, func.count())
                .where(TrialRecord.study_name == name, TrialRecord.stage == "tune")
                .group_by(TrialRecord.family, TrialRecord.state)):
            counts[family][state] = count
    return counts


def best_trials(url: str, name: str) -> dict[str, TrialView | None] | None:
    """The best complete trial per family (None for a family without one); None if no such study."""
    study = get_study(url, name)
    if study is None:
        return None
    return {family: next(iter(study_trials(url, name, state="COMPLETE", family=family, stage="tune", sort="value",
                                           limit=1).items), None) for family in study.families}


def learning_curve(url: str, trial_id: int) -> list[TurnRecord]:
    with sessions(url)() as session:
        return list(session.scalars(select(TurnRecord).where(TurnRecord.trial_id == trial_id)
                                    .order_by(TurnRecord.turn)))


_TRIAL_COLUMNS = ("trial_id", "study_name", "family", "stage", "parent_trial_id", "number", "state", "value",
                  "hidden_size", "parameter_count", "seed", "fail_reason", "turns_reported", "wall_seconds")
_CHECKPOINT_COLUMNS = ("path", "size_bytes", "sha256", "val_loss", "turn")


@cache  # built once, like _summary_query
def _trial_query() -> Select:
    """Everything a TrialView needs but its hyperparameters, as plain columns."""
    last = (select(_user_attributes.c.trial_id, _user_attributes.c.value_json.label("last_value"))
            .where(_user_attributes.c.key == "last_value").subquery())
    return (
        select(*(getattr(TrialRecord, name) for name in _TRIAL_COLUMNS), _trials.c.datetime_start,
               _trials.c.datetime_complete, last.c.last_value,
               *(getattr(CheckpointRecord, name).label(f"checkpoint_{name}") for name in _CHECKPOINT_COLUMNS))
        .join(_trials, _trials.c.trial_id == TrialRecord.trial_id)
        .outerjoin(CheckpointRecord, CheckpointRecord.trial_id == TrialRecord.trial_id)
        .outerjoin(last, last.c.trial_id == TrialRecord.trial_id)
    )


def _trial_views(connection, rows) -> list[TrialView]:
    """TrialViews of `_trial_query` rows, their hyperparameters read in one more query."""
    params: dict[int, dict[str, Any]] = {row.trial_id: {} for row in rows}
    if params:
        for trial_id, name, value, distribution in connection.execute(_params_by_trial(), {"ids": list(params)}):
            params[trial_id][name] = _distribution(distribution).to_external_repr(value)
    return _views(rows, params)


def _trials_by_id(connection, ids: list[int]) -> list[TrialView]:
    """TrialViews of the trials with these ids (a few): one query, a row per hyperparameter."""
    rows, params = {}, {}
    for row in connection.execute(_trials_with_params_by_id(), {"ids": ids}):
        rows.setdefault(row.trial_id, row)
        found = params.setdefault(row.trial_id, {})
        if row.param_name is not None:
            found[row.param_name] = _distribution(row.distribution_json).to_external_repr(row.param_value)
    return _views(list(rows.values()), params)


def _views(rows, params: dict[int, dict[str, Any]]) -> list[TrialView]:
    return [TrialView(
        **{name: getattr(row, name) for name in _TRIAL_COLUMNS if name != "study_name"},
        study=row.study_name,
        params=params[row.trial_id],
        last_value=None if row.last_value is None else json.loads(row.last_value),
        checkpoint=None if row.checkpoint_path is None else CheckpointView(
            *(getattr(row, f"checkpoint_{name}") for name in _CHECKPOINT_COLUMNS)),
        started_at=_utc(row.datetime_start),
        finished_at=_utc(row.datetime_complete),
    ) for row in rows]


@lru_cache(maxsize=1024)
def _distribution(distribution_json: str):
    return json_to_distribution(distribution_json)


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.replace(tzinfo=UTC)  # Optuna stores naive UTC


@cache  # built once: statements are immutable, and building one costs more than running it
def _summary_query() -> Select:
    """A study's own columns, with its tuning trials per state (counted by triggers as trials are
    written) and its best complete tuning trial (a correlated subquery): one statement for a page."""
    counts = [func.coalesce(getattr(TrialCountRecord, f"tuning_{state.lower()}"), 0).label(f"count_{state}")
              for state in TRIAL_STATES]
    best = (select(TrialRecord.trial_id)
            .where(TrialRecord.study_name == StudyRecord.name, TrialRecord.stage == "tune",
                   TrialRecord.state == "COMPLETE")
            .order_by(TrialRecord.value, TrialRecord.trial_id).limit(1).scalar_subquery().label("best_trial_id"))
    return (select(StudyRecord.name, StudyRecord.status, StudyRecord.spec, StudyRecord.created_at,
                   StudyRecord.started_at, StudyRecord.finished_at, StudyRecord.error, StudyRecord.best_possible_loss,
                   *counts, best)
            .outerjoin(TrialCountRecord, TrialCountRecord.study_name == StudyRecord.name))


@cache
def _study_query() -> Select:
    return _summary_query().where(StudyRecord.name == bindparam("name"))


@cache
def _trials_with_params_by_id() -> Select:
    """`_trial_query` for some trial ids, joined with their hyperparameters (None for a trial with none)."""
    return (_trial_query().add_columns(_params.c.param_name, _params.c.param_value, _params.c.distribution_json)
            .outerjoin(_params, _params.c.trial_id == TrialRecord.trial_id)
            .where(TrialRecord.trial_id.in_(bindparam("ids", expanding=True))).order_by(_params.c.param_id))


@cache
def _params_by_trial() -> Select:
    return (select(_params.c.trial_id, _params.c.param_name, _params.c.param_value, _params.c.distribution_json)
            .where(_params.c.trial_id.in_(bindparam("ids", expanding=True))).order_by(_params.c.param_id))


def _best_views(connection, rows) -> dict[int, TrialView]:
    ids = [row.best_trial_id for row in rows if row.best_trial_id is not None]
    return {view.trial_id: view for view in _trials_by_id(connection, ids)} if ids else {}


def _progress(connection, rows) -> dict[str, StudyProgress]:
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
def _running_starts_query() -> Select:
    return (select(_trials.c.datetime_start).join_from(TrialRecord, _trials, _trials.c.trial_id == TrialRecord.trial_id)
            .where(TrialRecord.study_name == bindparam("name"), TrialRecord.stage == bindparam("stage"),
                   TrialRecord.state == "RUNNING"))


def _study_view(row, best: TrialView | None, progress: StudyProgress) -> StudyView:
    spec = row.spec
    return StudyView(
        name=row.name,
        status=row.status,
        description=spec.get("description", ""),
        families=list(spec["families"]),
        parameter_budget=spec["parameter_budget"],
        trials_per_family=spec["tuning"]["trials"],
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        error=row.error,
        best_possible_loss=row.best_possible_loss,
        spec=spec,
        progress=progress,
        counts={state: getattr(row, f"count_{state}") for state in TRIAL_STATES},
        best=best,
    )
