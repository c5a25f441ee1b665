"""Trials as pandas frames: what the figures plot, the Pareto front's inputs, and the flat table `tuner export`
writes."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sqlalchemy import select

from lm_tuner.tuner.store.engine import reading, retried_on_disconnect
from lm_tuner.tuner.store.schema import (
    StudyRecord,
    TrialRecord,
)
from lm_tuner.tuner.store.views import TrialView


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
