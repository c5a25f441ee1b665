"""Read models of studies and trials, queried from Optuna's tables and the project's own in SQL.

The CLI, the API and the dashboard read through here, so they always agree. Every query is paged
or aggregated in the database: a study of thousands of trials is never loaded whole to answer one
page.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Generic, Literal, TypeVar

import numpy as np
import pandas as pd
from optuna.distributions import json_to_distribution
from optuna.storages._rdb.models import (  # Optuna's own table definitions, so queries follow its schema
    TrialModel,
    TrialParamModel,
    TrialUserAttributeModel,
)
from sqlalchemy import func, select

from tuner.db import CheckpointRecord, StudyRecord, TrialRecord, TurnRecord, engine_for, sessions

TRIAL_STATES = ("COMPLETE", "RUNNING", "PRUNED", "FAIL", "WAITING")
TRIAL_SORTS = ("number", "value", "family", "state", "started")

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
    counts: dict[str, int] = field(default_factory=dict)
    best: TrialView | None = None

    @property
    def trials_expected(self) -> int:
        return self.trials_per_family * len(self.families)

    @property
    def trials_finished(self) -> int:
        return sum(self.counts.get(state, 0) for state in ("COMPLETE", "PRUNED", "FAIL"))

    @property
    def best_possible_perplexity(self) -> float | None:
        return None if self.best_possible_loss is None else math.exp(self.best_possible_loss)


def list_studies(url: str, *, status: str | None = None, family: str | None = None, name_contains: str | None = None,
                 limit: int | None = None, offset: int = 0) -> Page[StudyView]:
    """Studies, newest first, filtered and paged in the database."""
    query = select(StudyRecord)
    if status:
        query = query.where(StudyRecord.status == status)
    if family:
        query = query.where(StudyRecord.families.contains(f",{family},", autoescape=True))
    if name_contains:
        query = query.where(StudyRecord.name.contains(name_contains, autoescape=True))
    with sessions(url)() as session:
        total = session.scalar(select(func.count()).select_from(query.subquery()))
        records = session.scalars(query.order_by(StudyRecord.created_at.desc(), StudyRecord.id.desc())
                                  .limit(limit).offset(offset)).all()
        counts = _state_counts(session, records)
        best = _best_trials(session, records)
    views = [_study_view(r, counts.get(r.name, {}), best.get(r.name)) for r in records]
    return Page(views, total, limit, offset)


def study_families(url: str) -> list[str]:
    """Every family some study compares, sorted (for filters)."""
    with sessions(url)() as session:
        stored = session.scalars(select(StudyRecord.families).distinct()).all()
    return sorted({family for families in stored for family in families.strip(",").split(",") if family})


def study_exists(url: str, name: str) -> bool:
    with sessions(url)() as session:
        return session.scalar(select(StudyRecord.id).where(StudyRecord.name == name)) is not None


def get_study(url: str, name: str) -> StudyView | None:
    with sessions(url)() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
        if record is None:
            return None
        counts = _state_counts(session, [record])
        best = _best_trials(session, [record])
    return _study_view(record, counts.get(name, {}), best.get(name))


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
    with sessions(url)() as session:
        total = session.scalar(select(func.count()).select_from(TrialRecord).where(*filters))
        rows = session.execute(_trial_query().where(*filters).order_by(*order, TrialRecord.trial_id)
                               .limit(limit).offset(offset)).all()
        views = _trial_views(session, rows)
    return Page(views, total, limit, offset)


def get_trial(url: str, trial_id: int) -> TrialView | None:
    with sessions(url)() as session:
        row = session.execute(_trial_query().where(TrialRecord.trial_id == trial_id)).first()
        return None if row is None else _trial_views(session, [row])[0]


def pareto_frame(url: str, name: str) -> pd.DataFrame:
    """Complete trials with what a Pareto plot can put on its axes (no hyperparameters loaded)."""
    with engine_for(url).connect() as connection:  # Core rows: no ORM bookkeeping for thousands of trials
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


def _trial_query():
    return (
        select(TrialRecord, _trials.c.datetime_start, _trials.c.datetime_complete, CheckpointRecord)
        .join(_trials, _trials.c.trial_id == TrialRecord.trial_id)
        .outerjoin(CheckpointRecord, CheckpointRecord.trial_id == TrialRecord.trial_id)
    )


def _trial_views(session, rows) -> list[TrialView]:
    ids = [row[0].trial_id for row in rows]
    params: dict[int, dict[str, Any]] = {trial_id: {} for trial_id in ids}
    for trial_id, param_name, param_value, distribution in session.execute(
            select(_params.c.trial_id, _params.c.param_name, _params.c.param_value, _params.c.distribution_json)
            .where(_params.c.trial_id.in_(ids)).order_by(_params.c.param_id)):
        params[trial_id][param_name] = _distribution(distribution).to_external_repr(param_value)
    last_values = dict(session.execute(
        select(_user_attributes.c.trial_id, _user_attributes.c.value_json)
        .where(_user_attributes.c.trial_id.in_(ids), _user_attributes.c.key == "last_value")).all())
    views = []
    for record, started, finished, checkpoint in rows:
        views.append(TrialView(
            trial_id=record.trial_id,
            study=record.study_name,
            family=record.family,
            stage=record.stage,
            parent_trial_id=record.parent_trial_id,
            number=record.number,
            state=record.state,
            value=record.value,
            params=params[record.trial_id],
            hidden_size=record.hidden_size,
            parameter_count=record.parameter_count,
            seed=record.seed,
            fail_reason=record.fail_reason,
            turns_reported=record.turns_reported,
            wall_seconds=record.wall_seconds,
            last_value=json.loads(last_values[record.trial_id]) if record.trial_id in last_values else None,
            checkpoint=None if checkpoint is None else CheckpointView(
                checkpoint.path, checkpoint.size_bytes, checkpoint.sha256, checkpoint.val_loss, checkpoint.turn),
            started_at=_utc(started),
            finished_at=_utc(finished),
        ))
    return views


@lru_cache(maxsize=1024)
def _distribution(distribution_json: str):
    return json_to_distribution(distribution_json)


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.replace(tzinfo=UTC)  # Optuna stores naive UTC


def _state_counts(session, records: list[StudyRecord]) -> dict[str, dict[str, int]]:
    names = [r.name for r in records]
    counts: dict[str, dict[str, int]] = {name: dict.fromkeys(TRIAL_STATES, 0) for name in names}
    for study, state, count in session.execute(
            select(TrialRecord.study_name, TrialRecord.state, func.count())
            .where(TrialRecord.study_name.in_(names), TrialRecord.stage == "tune")
            .group_by(TrialRecord.study_name, TrialRecord.state)):
        counts[study][state] = count
    return counts


def _best_trials(session, records: list[StudyRecord]) -> dict[str, TrialView]:
    best = {}
    for record in records:
        row = session.execute(_trial_query().where(TrialRecord.study_name == record.name,
                                                   TrialRecord.stage == "tune", TrialRecord.state == "COMPLETE")
                              .order_by(TrialRecord.value, TrialRecord.trial_id).limit(1)).first()
        if row is not None:
            best[record.name] = _trial_views(session, [row])[0]
    return best


def _study_view(record: StudyRecord, counts: dict[str, int], best: TrialView | None) -> StudyView:
    spec = record.spec
    return StudyView(
        name=record.name,
        status=record.status,
        description=spec.get("description", ""),
        families=list(spec["families"]),
        parameter_budget=spec["parameter_budget"],
        trials_per_family=spec["tuning"]["trials"],
        created_at=record.created_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        error=record.error,
        best_possible_loss=record.best_possible_loss,
        spec=spec,
        counts={**dict.fromkeys(TRIAL_STATES, 0), **counts},
        best=best,
    )

