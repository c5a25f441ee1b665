"""What the dashboard's plots show, aggregated in the database: one call per figure, only the columns it draws.

Scores are in the study's unit: perplexity for word-level corpora, bits per character for character-level.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.importance import (
    FanovaImportanceEvaluator,
    MeanDecreaseImpurityImportanceEvaluator,
    PedAnovaImportanceEvaluator,
)
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState, create_trial
from sqlalchemy import func, select

from lm_tuner.tuner.analysis.compute_account import StudyAccount
from lm_tuner.tuner.spec.units import Unit, unit_of
from lm_tuner.tuner.store.engine import engine_for, sessions
from lm_tuner.tuner.store.optuna_internals import TrialParamModel, TrialUserAttributeModel
from lm_tuner.tuner.store.schema import EvaluationRecord, StudyRecord, TrialRecord, TurnRecord

Evaluator = Literal["fanova", "ped_anova", "mean_decrease_impurity"]


EVALUATORS = {"fanova": FanovaImportanceEvaluator, "ped_anova": PedAnovaImportanceEvaluator,
              "mean_decrease_impurity": MeanDecreaseImpurityImportanceEvaluator}


MAX_CURVES = 12  # learning curves drawn at once
DEFAULT_BEST_CURVES = 5  # the best complete trials whose learning curves are drawn unless others are chosen


_params = TrialParamModel.__table__


_user_attributes = TrialUserAttributeModel.__table__


def study_unit(url: str, name: str) -> Unit:
    with sessions(url)() as session:
        return unit_of(session.scalar(select(StudyRecord.spec).where(StudyRecord.name == name)))


def history_frame(url: str, name: str) -> pd.DataFrame:
    """Every tuning trial: family, number, state, score (complete), last score (pruned), failure reason."""
    unit = study_unit(url, name)
    last = (select(_user_attributes.c.trial_id, _user_attributes.c.value_json)
            .where(_user_attributes.c.key == "last_value").subquery())
    query = (select(TrialRecord.trial_id, TrialRecord.family, TrialRecord.number, TrialRecord.state,
                    TrialRecord.value, last.c.value_json, TrialRecord.fail_reason)
             .outerjoin(last, last.c.trial_id == TrialRecord.trial_id)
             .where(TrialRecord.study_name == name, TrialRecord.stage == "tune")
             .order_by(TrialRecord.family, TrialRecord.number))
    with engine_for(url).connect() as connection:
        rows = [tuple(row) for row in connection.execute(query)]
    frame = pd.DataFrame(rows, columns=["trial_id", "family", "number", "state", "value", "last_value",
                                        "fail_reason"])
    frame["score"] = unit.convert(frame["value"].astype(float))
    last_values = pd.to_numeric(frame["last_value"], errors="coerce")  # JSON text of a number (or Infinity)
    frame["last_score"] = unit.convert(last_values.where(np.isfinite(last_values)))
    return frame.drop(columns=["last_value"])


@dataclass(frozen=True)
class ParameterTable:
    """Complete tuning trials of one family with their hyperparameters, and the searched distributions."""

    family: str
    frame: pd.DataFrame  # trial_id, number, score, then one column per hyperparameter
    distributions: dict[str, BaseDistribution]
    unit: Unit


def parameter_table(url: str, name: str, family: str) -> ParameterTable:
    unit = study_unit(url, name)
    with engine_for(url).connect() as connection:
        trials = [tuple(row) for row in connection.execute(
            select(TrialRecord.trial_id, TrialRecord.number, TrialRecord.value)
            .where(TrialRecord.study_name == name, TrialRecord.family == family, TrialRecord.stage == "tune",
                   TrialRecord.state == "COMPLETE"))]
        params = [tuple(row) for row in connection.execute(
            select(_params.c.trial_id, _params.c.param_name, _params.c.param_value, _params.c.distribution_json)
            .join(TrialRecord, TrialRecord.trial_id == _params.c.trial_id)
            .where(TrialRecord.study_name == name, TrialRecord.family == family, TrialRecord.stage == "tune",
                   TrialRecord.state == "COMPLETE"))]
    frame = pd.DataFrame(trials, columns=["trial_id", "number", "value"])
    distributions: dict[str, BaseDistribution] = {}
    if params:
        long = pd.DataFrame(params, columns=["trial_id", "param", "internal", "distribution"])
        for param_name, distribution_json in long.drop_duplicates("param")[["param", "distribution"]].itertuples(
                index=False):
            distributions[param_name] = _distribution(distribution_json)
        wide = long.pivot(index="trial_id", columns="param", values="internal")
        for param_name, distribution in distributions.items():  # categorical choices are stored as indices
            if isinstance(distribution, CategoricalDistribution):
                wide[param_name] = [None if pd.isna(v) else distribution.to_external_repr(v) for v in wide[param_name]]
        frame = frame.join(wide, on="trial_id")
    frame["score"] = unit.convert(frame["value"].astype(float))
    return ParameterTable(family, frame.drop(columns=["value"]), distributions, unit)


def importances(url: str, name: str, family: str, evaluator: Evaluator) -> dict[str, float]:
    """Optuna's importance of each hyperparameter for one family (empty below two complete trials).

    Cached per number of complete trials: a running study is re-evaluated only when a trial finishes.
    """
    with sessions(url)() as session:
        complete = session.scalar(select(func.count()).select_from(TrialRecord).where(
            TrialRecord.study_name == name, TrialRecord.family == family, TrialRecord.stage == "tune",
            TrialRecord.state == "COMPLETE"))
    return dict(_importances(url, name, family, evaluator, complete))


@lru_cache(maxsize=64)
def _importances(url: str, name: str, family: str, evaluator: Evaluator, complete: int) -> tuple[tuple[str, float]]:
    table = parameter_table(url, name, family)
    searched = [p for p, d in table.distributions.items() if not d.single()]
    if complete < 2 or not searched:
        return ()
    # Optuna logs the creation of every study at INFO: for this throwaway one, a line in the server's log at each
    # view of a study page.
    logging.getLogger(InMemoryStorage.__module__).setLevel(logging.WARNING)
    study = optuna.create_study(direction="minimize")
    study.add_trials([
        create_trial(state=TrialState.COMPLETE, value=float(row["score"]),
                     params={p: _external(table.distributions[p], row[p]) for p in searched if not pd.isna(row[p])},
                     distributions={p: table.distributions[p] for p in searched if not pd.isna(row[p])})
        for _, row in table.frame.iterrows()])
    result = optuna.importance.get_param_importances(study, evaluator=EVALUATORS[evaluator](), normalize=True)
    return tuple((key, float(value)) for key, value in result.items())


def curves_frame(url: str, trial_ids: list[int], unit: Unit) -> pd.DataFrame:
    """The learning curves of the given trials (at most MAX_CURVES), one row per turn, labelled with family
    and number; losses also as scores in `unit`."""
    with engine_for(url).connect() as connection:
        rows = [tuple(row) for row in connection.execute(
            select(TurnRecord.trial_id, TrialRecord.family, TrialRecord.stage, TrialRecord.number, TurnRecord.turn,
                   TurnRecord.train_loss, TurnRecord.val_loss, TurnRecord.averaging_length,
                   TurnRecord.learning_rate)
            .join(TrialRecord, TrialRecord.trial_id == TurnRecord.trial_id)
            .where(TurnRecord.trial_id.in_(trial_ids[:MAX_CURVES]))
            .order_by(TurnRecord.trial_id, TurnRecord.turn))]
    frame = pd.DataFrame(rows, columns=["trial_id", "family", "stage", "number", "turn", "train_loss", "val_loss",
                                        "averaging_length", "learning_rate"])
    frame["train_score"] = unit.convert(frame["train_loss"])
    frame["val_score"] = unit.convert(frame["val_loss"])
    return frame


def budget_frame(account: StudyAccount, unit: Unit) -> pd.DataFrame:
    """The best-so-far curves of a study's compute account: a row per tuning turn where a family's best improved, and
    its last, in the order recorded, with the family's spend after it (tokens, compute_seconds; NaN where not
    recorded) and its best so far as a score in `unit` (NaN before a first finite loss)."""
    rows = [(family.family, *(getattr(corner, axis) if family.known(axis) else None for axis in ("tokens", "compute")),
             corner.best_loss) for family in account.families for corner in family.corners]
    frame = pd.DataFrame(rows, columns=["family", "tokens", "compute_seconds", "best_loss"], dtype=object)
    frame = frame.astype({"tokens": float, "compute_seconds": float, "best_loss": float})
    frame["score"] = unit.convert(frame["best_loss"])
    return frame


def trials_in_study(url: str, name: str, trial_ids: list[int]) -> set[int]:
    """Those of `trial_ids` that belong to the study."""
    with sessions(url)() as session:
        return set(session.scalars(select(TrialRecord.trial_id).where(
            TrialRecord.study_name == name, TrialRecord.trial_id.in_(trial_ids))))


def default_curve_trial_ids(url: str, name: str) -> list[int]:
    """The learning curves shown until trials are chosen: the DEFAULT_BEST_CURVES best complete tuning trials, best
    first, then every running trial that has reported a turn (while a study runs, its curves are the news), at most
    MAX_CURVES in all."""
    with sessions(url)() as session:
        best = list(session.scalars(select(TrialRecord.trial_id).where(
            TrialRecord.study_name == name, TrialRecord.stage == "tune", TrialRecord.state == "COMPLETE")
            .order_by(TrialRecord.value, TrialRecord.trial_id).limit(DEFAULT_BEST_CURVES)))
        running = list(session.scalars(select(TrialRecord.trial_id).where(
            TrialRecord.study_name == name, TrialRecord.state == "RUNNING", TrialRecord.turns_reported > 0)
            .order_by(TrialRecord.trial_id).limit(MAX_CURVES)))
    return (best + running)[:MAX_CURVES]


@dataclass(frozen=True)
class EvaluationView:
    kind: str
    valid_loss: float
    test_loss: float
    logit_scale: float
    settings: dict[str, Any]
    dyneval_trial_id: int | None


def trial_evaluations(url: str, trial_id: int) -> list[EvaluationView]:
    with sessions(url)() as session:
        return [EvaluationView(r.kind, r.valid_loss, r.test_loss, r.logit_scale, r.settings, r.dyneval_trial_id)
                for r in session.scalars(select(EvaluationRecord).where(EvaluationRecord.trial_id == trial_id)
                                         .order_by(EvaluationRecord.id))]


@lru_cache(maxsize=1024)
def _distribution(distribution_json: str) -> BaseDistribution:
    return optuna.distributions.json_to_distribution(distribution_json)


def _external(distribution: BaseDistribution, value: Any) -> Any:
    if isinstance(distribution, IntDistribution):
        return int(value)
    if isinstance(distribution, FloatDistribution):
        return float(value)
    return value.item() if isinstance(value, np.generic) else value
