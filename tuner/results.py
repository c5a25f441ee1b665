"""Read models of studies and trials, joined from Optuna's tables and the project's own.

The CLI, the API and the dashboard read through here, so they always agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import func, select

from tuner.db import CheckpointRecord, StudyRecord, TrialRecord, TurnRecord, optuna_storage, sessions
from tuner.space import optuna_study_name

TRIAL_STATES = ("COMPLETE", "RUNNING", "PRUNED", "FAIL", "WAITING")


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
    number: int
    state: str
    value: float | None  # best validation cross-entropy, nats/token (COMPLETE trials only)
    params: dict[str, Any]
    hidden_size: int | None
    parameter_count: int | None
    seed: int | None
    fail_reason: str | None
    turns_reported: int
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
    def best_possible_perplexity(self) -> float | None:
        return None if self.best_possible_loss is None else math.exp(self.best_possible_loss)

    @property
    def trials_expected(self) -> int:
        return self.trials_per_family * len(self.families)

    @property
    def trials_finished(self) -> int:
        return sum(self.counts.get(state, 0) for state in ("COMPLETE", "PRUNED", "FAIL"))


def list_studies(url: str) -> list[StudyView]:
    with sessions(url)() as session:
        records = session.scalars(select(StudyRecord).order_by(StudyRecord.created_at.desc())).all()
    return [_study_view(record, study_trials(url, record.name)) for record in records]


def get_study(url: str, name: str) -> StudyView | None:
    with sessions(url)() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
    return None if record is None else _study_view(record, study_trials(url, name))


def study_trials(url: str, name: str) -> list[TrialView]:
    """Every trial of a study, all families, ordered by family then trial number."""
    with sessions(url)() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
        if record is None:
            return []
        extras = {r.trial_id: r for r in session.scalars(select(TrialRecord).where(TrialRecord.study_name == name))}
        ids = list(extras)
        checkpoints = {c.trial_id: c for c in session.scalars(
            select(CheckpointRecord).where(CheckpointRecord.trial_id.in_(ids)))}
        turns = dict(session.execute(
            select(TurnRecord.trial_id, func.count()).where(TurnRecord.trial_id.in_(ids)).group_by(TurnRecord.trial_id)
        ).all())
    storage = optuna_storage(url)
    views = []
    for family in record.spec["families"]:
        for trial in _optuna_trials(storage, optuna_study_name(name, family)):
            trial_id = trial._trial_id
            views.append(_trial_view(name, family, trial, extras.get(trial_id), checkpoints.get(trial_id),
                                     turns.get(trial_id, 0)))
    return views


def get_trial(url: str, trial_id: int) -> TrialView | None:
    with sessions(url)() as session:
        extra = session.get(TrialRecord, trial_id)
    if extra is None:
        return None
    return next((t for t in study_trials(url, extra.study_name) if t.trial_id == trial_id), None)


def trials_frame(trials: list[TrialView]) -> pd.DataFrame:
    """One row per trial with the columns the figures plot."""
    columns = ["trial_id", "family", "number", "state", "value", "perplexity", "parameter_count", "hidden_size"]
    return pd.DataFrame([{name: getattr(trial, name) for name in columns} for trial in trials], columns=columns)


def trials_table(trials: list[TrialView]) -> pd.DataFrame:
    """Everything about each trial in flat columns (hyperparameters prefixed `param.`), for export."""
    rows = []
    for trial in trials:
        row = {name: getattr(trial, name) for name in (
            "trial_id", "family", "number", "state", "value", "perplexity", "last_value", "parameter_count",
            "hidden_size", "seed", "turns_reported", "started_at", "finished_at", "fail_reason")}
        row |= {f"param.{key}": value for key, value in trial.params.items()}
        row["checkpoint"] = trial.checkpoint.path if trial.checkpoint else None
        rows.append(row)
    return pd.DataFrame(rows)


def best_trials(url: str, name: str) -> dict[str, TrialView | None] | None:
    """The best complete trial per family (None for a family without one); None if no such study."""
    study = get_study(url, name)
    if study is None:
        return None
    trials = study_trials(url, name)
    return {family: min((t for t in trials if t.family == family and t.value is not None),
                        key=lambda t: t.value, default=None) for family in study.families}


def learning_curve(url: str, trial_id: int) -> list[TurnRecord]:
    with sessions(url)() as session:
        return list(session.scalars(select(TurnRecord).where(TurnRecord.trial_id == trial_id)
                                    .order_by(TurnRecord.turn)))


def _optuna_trials(storage, optuna_name: str) -> list[FrozenTrial]:
    try:
        study_id = storage.get_study_id_from_name(optuna_name)
    except KeyError:
        return []  # not started yet
    return storage.get_all_trials(study_id, deepcopy=False)


def _trial_view(study: str, family: str, trial: FrozenTrial, extra: TrialRecord | None,
                checkpoint: CheckpointRecord | None, turns: int) -> TrialView:
    return TrialView(
        trial_id=trial._trial_id,
        study=study,
        family=family,
        number=trial.number,
        state=trial.state.name,
        value=trial.value if trial.state == TrialState.COMPLETE else None,
        params=dict(trial.params),
        hidden_size=extra.hidden_size if extra else None,
        parameter_count=extra.parameter_count if extra else None,
        seed=extra.seed if extra else None,
        fail_reason=extra.fail_reason if extra else None,
        turns_reported=turns,
        last_value=trial.user_attrs.get("last_value"),
        checkpoint=None if checkpoint is None else CheckpointView(
            checkpoint.path, checkpoint.size_bytes, checkpoint.sha256, checkpoint.val_loss, checkpoint.turn),
        started_at=trial.datetime_start,
        finished_at=trial.datetime_complete,
    )


def _study_view(record: StudyRecord, trials: list[TrialView]) -> StudyView:
    counts = {state: 0 for state in TRIAL_STATES}
    for trial in trials:
        counts[trial.state] = counts.get(trial.state, 0) + 1
    complete = [t for t in trials if t.value is not None]
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
        counts=counts,
        best=min(complete, key=lambda t: t.value) if complete else None,
    )
