"""Trials read from Optuna's tables and the project's own in SQL, a page at a time, with their hyperparameters
and best checkpoint; and the records of a family's best and final trials, which the later stages and the comparison
start from."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import cache, lru_cache
from typing import Any, Literal

from optuna.distributions import json_to_distribution
from sqlalchemy import Select, bindparam, func, select

from lm_tuner.tuner.store.engine import reading, retried_on_disconnect, sessions
from lm_tuner.tuner.store.optuna_internals import PARAMS as _params
from lm_tuner.tuner.store.optuna_internals import TRIALS as _trials
from lm_tuner.tuner.store.optuna_internals import USER_ATTRIBUTES as _user_attributes
from lm_tuner.tuner.store.schema import (
    CheckpointRecord,
    TrialRecord,
    TurnRecord,
)
from lm_tuner.tuner.store.views import CheckpointView, Page, TrialView


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
        views = trials_by_id(connection, [trial_id])
    return views[0] if views else None


def learning_curve(url: str, trial_id: int) -> list[TurnRecord]:
    with sessions(url)() as session:
        return list(session.scalars(select(TurnRecord).where(TurnRecord.trial_id == trial_id)
                                    .order_by(TurnRecord.turn)))


_TRIAL_COLUMNS = ("trial_id", "study_name", "family", "stage", "parent_trial_id", "number", "state", "value",
                  "hidden_size", "parameter_count", "seed", "fail_reason", "interrupted", "turns_reported",
                  "wall_seconds",
                  "train_seconds", "eval_seconds", "val_tokens", "val_subset", "full_value",
                  "reversed_loss", "reversed_accuracy")


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


def trials_by_id(connection, ids: list[int]) -> list[TrialView]:
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


def top_trials(url: str, study: str, family: str, stage: str, count: int) -> list[TrialRecord]:
    """The best complete trials of one family and stage, by validation loss."""
    with sessions(url)() as session:
        return list(session.scalars(
            select(TrialRecord).where(TrialRecord.study_name == study, TrialRecord.family == family,
                                      TrialRecord.stage == stage, TrialRecord.state == "COMPLETE")
            .order_by(TrialRecord.value, TrialRecord.trial_id).limit(count)))


def final_trials(url: str, study: str, family: str, *, reruns: bool) -> list[TrialRecord]:
    """The trials whose checkpoints the comparison is made on: the complete reruns where the spec asks for `reruns`,
    else the best tuning trial."""
    if reruns:
        with sessions(url)() as session:
            return list(session.scalars(select(TrialRecord).where(
                TrialRecord.study_name == study, TrialRecord.family == family, TrialRecord.stage == "rerun",
                TrialRecord.state == "COMPLETE").order_by(TrialRecord.value)))
    return top_trials(url, study, family, "tune", 1)
