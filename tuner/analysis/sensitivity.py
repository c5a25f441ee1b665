"""What the measured sensitivity runs found: each run's moved value and score, the effect per value, and how many
runs are still to come. `tuner.run.sensitivity` queues and trains the runs; this module only reads them."""

from __future__ import annotations

import json

import optuna
import pandas as pd
from sqlalchemy import select

from lm_tuner.tuner.run.sensitivity import MOVED, STAGE, queued_count
from lm_tuner.tuner.spec.units import unit_of
from lm_tuner.tuner.store.engine import engine_for, optuna_storage, sessions
from lm_tuner.tuner.store.optuna_internals import TrialParamModel, TrialUserAttributeModel
from lm_tuner.tuner.store.optuna_names import optuna_studies_of
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord

_params = TrialParamModel.__table__
_user_attributes = TrialUserAttributeModel.__table__


def sensitivity_runs(url: str, name: str, parameter: str) -> pd.DataFrame:
    """One row per sensitivity run of `parameter`: family, trial_id, state, value moved to, score."""
    with sessions(url)() as session:
        unit = unit_of(session.scalar(select(StudyRecord.spec).where(StudyRecord.name == name)))
    moved = (select(_user_attributes.c.trial_id).where(_user_attributes.c.key == MOVED,
                                                       _user_attributes.c.value_json == json.dumps(parameter))
             .subquery())
    query = (select(TrialRecord.family, TrialRecord.trial_id, TrialRecord.state, TrialRecord.seed,
                    _params.c.param_value, _params.c.distribution_json, TrialRecord.value)
             .join(moved, moved.c.trial_id == TrialRecord.trial_id)
             .join(_params, (_params.c.trial_id == TrialRecord.trial_id) & (_params.c.param_name == parameter))
             .where(TrialRecord.study_name == name, TrialRecord.stage == STAGE)
             .order_by(TrialRecord.trial_id))
    with engine_for(url).connect() as connection:
        rows = [tuple(row) for row in connection.execute(query)]
    frame = pd.DataFrame(rows, columns=["family", "trial_id", "state", "seed", "internal", "distribution", "loss"])
    frame["value"] = [optuna.distributions.json_to_distribution(d).to_external_repr(v)
                      for v, d in zip(frame["internal"], frame["distribution"], strict=True)]
    frame["score"] = unit.convert(frame["loss"].astype(float))
    return frame.drop(columns=["internal", "distribution", "loss"])


def measured_effect(runs: pd.DataFrame) -> pd.DataFrame:
    """Per family and moved value: mean and sample std of the complete runs' scores, and how many ran."""
    complete = runs[runs["state"] == "COMPLETE"]
    summary = (complete.groupby(["family", "value"])["score"].agg(["mean", "std", "count"]).reset_index())
    summary["std"] = summary["std"].fillna(0.0)
    return summary


def pending_runs(url: str, name: str, runs: pd.DataFrame) -> int:
    """Sensitivity runs of the study still queued (any hyperparameter) or running (among `runs`)."""
    storage = optuna_storage(url)
    queued = sum(queued_count(storage, optuna_name) for optuna_name in optuna_studies_of(url, name)
                 if optuna_name.endswith(f"/{STAGE}"))
    return queued + int((runs["state"] == "RUNNING").sum())
