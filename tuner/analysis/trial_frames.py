"""Trials as pandas frames: the Pareto front's inputs, and the flat table of every metric `tuner export` writes."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import and_, func, select

from lm_tuner.tuner.analysis.compute_account import compute_unit
from lm_tuner.tuner.analysis.study_facts import validation_label
from lm_tuner.tuner.spec.units import Unit, unit_of
from lm_tuner.tuner.store.engine import reading, retried_on_disconnect
from lm_tuner.tuner.store.schema import EvaluationRecord, StudyRecord, TrialRecord, TurnRecord
from lm_tuner.tuner.store.trials import study_trials
from lm_tuner.tuner.store.views import TrialView


@retried_on_disconnect
def pareto_frame(url: str, name: str) -> pd.DataFrame:
    """Complete trials with what a Pareto plot can put on its axes (no hyperparameters loaded); `attrs` holds the
    study's compute unit (what compute_seconds are: CPU core-seconds or GPU-seconds)."""
    with reading(url) as connection:  # Core rows: no ORM bookkeeping for thousands of trials
        spec = connection.scalar(select(StudyRecord.spec).where(StudyRecord.name == name)) or {}
        rows = connection.execute(
            select(TrialRecord.trial_id, TrialRecord.family, TrialRecord.number, TrialRecord.value,
                   TrialRecord.parameter_count, TrialRecord.wall_seconds, TrialRecord.compute_seconds)
            .where(TrialRecord.study_name == name, TrialRecord.stage == "tune", TrialRecord.state == "COMPLETE")
        )
        rows = [tuple(row) for row in rows]  # plain tuples: pandas probes Row objects slowly
    frame = pd.DataFrame(rows, columns=["trial_id", "family", "number", "value", "parameter_count", "wall_seconds",
                                       "compute_seconds"])
    frame["compute_seconds"] = frame["compute_seconds"].astype(float)  # None (not recorded) as NaN
    frame["perplexity"] = np.exp(frame["value"].astype(float))
    gpus_per_trial = spec.get("resources", {}).get("gpus_per_trial", 0.0)
    frame["gpu_seconds"] = frame["wall_seconds"] * gpus_per_trial  # GPU time reserved for the trial
    frame.attrs["compute_unit"] = compute_unit(spec)
    return frame


def export_frame(url: str, name: str) -> pd.DataFrame:
    """Every metric of every trial of a study in flat columns, one row per trial, for `tuner export`: the trial's
    fields (hyperparameters prefixed `param.`), which validation set its value is on, each final evaluation's
    losses and scores (prefixed `eval.KIND.`: deterministic, mc, dynamic, dynamic_mc) with its settings, and the
    values of its last learning-curve turn (prefixed `last.`)."""
    with reading(url) as connection:
        spec = connection.scalar(select(StudyRecord.spec).where(StudyRecord.name == name)) or {}
    unit = unit_of(spec)
    label = validation_label(spec)
    records, evaluations, last_turns = _trial_records(url, name), _evaluation_columns(url, name, unit), \
        _last_turn_columns(url, name)
    rows = []
    for trial in study_trials(url, name).items:
        row = trials_row(trial) | {"value_validation_set": label}
        row |= {key: value for key, value in records.get(trial.trial_id, {}).items() if key not in row}
        rows.append(row | evaluations.get(trial.trial_id, {}) | last_turns.get(trial.trial_id, {}))
    return pd.DataFrame(rows)


def trials_row(trial: TrialView) -> dict[str, Any]:
    """A trial's own fields, flat (hyperparameters prefixed `param.`)."""
    row = {name: getattr(trial, name) for name in (
        "trial_id", "family", "stage", "parent_trial_id", "number", "state", "value", "perplexity", "last_value",
        "parameter_count", "hidden_size", "seed", "turns_reported", "wall_seconds", "started_at", "finished_at",
        "fail_reason")}
    row |= {f"param.{key}": value for key, value in trial.params.items()}
    row["checkpoint"] = trial.checkpoint.path if trial.checkpoint else None
    return row


def _trial_records(url: str, name: str) -> dict[int, dict[str, Any]]:
    """Every column of the study's trial records (those a TrialView leaves out among them), by trial id."""
    with reading(url) as connection:
        rows = connection.execute(select(TrialRecord.__table__).where(TrialRecord.study_name == name)).mappings()
        return {row["trial_id"]: dict(row) for row in rows}


def _evaluation_columns(url: str, name: str, unit: Unit) -> dict[int, dict[str, Any]]:
    table = EvaluationRecord.__table__
    query = (select(table).join(TrialRecord, TrialRecord.trial_id == table.c.trial_id)
             .where(TrialRecord.study_name == name).order_by(table.c.id))
    columns: dict[int, dict[str, Any]] = {}
    with reading(url) as connection:
        for row in connection.execute(query).mappings():
            prefix = f"eval.{row['kind']}."
            found = columns.setdefault(row["trial_id"], {})
            for split in ("valid", "test"):
                found[f"{prefix}{split}_loss"] = row[f"{split}_loss"]
                found[f"{prefix}{split}_{unit.name}"] = unit.of(row[f"{split}_loss"])
            found |= {prefix + key: row[key] for key in ("logit_scale", "dyneval_trial_id", "created_at")}
            found |= {f"{prefix}settings.{key}": value for key, value in _flat(row["settings"] or {}).items()}
    return columns


def _last_turn_columns(url: str, name: str) -> dict[int, dict[str, Any]]:
    """The values of each trial's last reported turn (every column of the learning curve)."""
    table = TurnRecord.__table__
    last = (select(table.c.trial_id, func.max(table.c.turn).label("turn"))
            .join(TrialRecord, TrialRecord.trial_id == table.c.trial_id)
            .where(TrialRecord.study_name == name).group_by(table.c.trial_id).subquery())
    query = select(table).join(last, and_(last.c.trial_id == table.c.trial_id, last.c.turn == table.c.turn))
    with reading(url) as connection:
        return {row["trial_id"]: {f"last.{key}": value for key, value in row.items() if key not in ("id", "trial_id")}
                for row in connection.execute(query).mappings()}


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys; lists as JSON text, so that each value fits one cell."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, list) else value
    return flat
