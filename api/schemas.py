"""Response bodies of the REST API, built from the tuner's read models."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lm_tuner.tuner.db import TurnRecord
from lm_tuner.tuner.results import StudyView, TrialView
from lm_tuner.tuner.study_progress import StageProgress


class CheckpointOut(BaseModel):
    url: str
    size_bytes: int
    sha256: str
    val_loss: float
    turn: int


class TrialOut(BaseModel):
    trial_id: int
    study: str
    family: str
    stage: str
    parent_trial_id: int | None
    number: int
    state: str
    value: float | None
    perplexity: float | None
    params: dict[str, Any]
    hidden_size: int | None
    parameter_count: int | None
    seed: int | None
    fail_reason: str | None
    turns_reported: int
    wall_seconds: float | None
    last_value: float | None
    checkpoint: CheckpointOut | None
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, trial: TrialView) -> TrialOut:
        checkpoint = trial.checkpoint
        return cls(
            **{name: getattr(trial, name) for name in cls.model_fields if name not in ("checkpoint", "perplexity")},
            perplexity=trial.perplexity,
            checkpoint=None if checkpoint is None else CheckpointOut(
                url=f"/trials/{trial.trial_id}/checkpoint", size_bytes=checkpoint.size_bytes,
                sha256=checkpoint.sha256, val_loss=checkpoint.val_loss, turn=checkpoint.turn),
        )


class TurnOut(BaseModel):
    turn: int
    step: int
    train_loss: float
    val_loss: float
    best_val_loss: float
    tokens_per_second: float
    wall_seconds: float
    process_seconds: float | None
    averaging_length: int | None
    learning_rate: float | None
    epochs: float | None

    @classmethod
    def of(cls, record: TurnRecord) -> TurnOut:
        return cls(**{name: getattr(record, name) for name in cls.model_fields})


class EvaluationOut(BaseModel):
    kind: str
    valid_loss: float
    test_loss: float
    valid_score: float
    test_score: float
    logit_scale: float
    settings: dict[str, Any]
    dyneval_trial_id: int | None


class TrialDetailOut(TrialOut):
    learning_curve: list[TurnOut]
    evaluations: list[EvaluationOut]


class StageProgressOut(BaseModel):
    stage: str = Field(description="tune, rerun or dyneval")
    label: str = Field(description="tuning, reruns or dynamic evaluation")
    planned: int = Field(description="trials the spec asks for in this stage")
    settled: int = Field(description="finished trials that count against the plan (an interrupted trial is run "
                                     "again and does not count); never more than planned")
    running: int
    fraction: float = Field(description="settled / planned, 0 to 1")
    eta_seconds: float | None = Field(description="time the stage's remaining trials need at its finished "
                                                  "trials' mean duration, run `concurrency` at a time; "
                                                  "only for the current stage of a running study")

    @classmethod
    def of(cls, stage: StageProgress) -> StageProgressOut:
        return cls(**{name: getattr(stage, name) for name in cls.model_fields})


class StudyOut(BaseModel):
    name: str
    status: str
    description: str
    families: list[str]
    parameter_budget: int
    trials_per_family: int
    trials_expected: int = Field(description="trials of every stage the spec asks for")
    trials_finished: int = Field(description="of those, trials that count against the plan")
    progress: float = Field(description="trials_finished / trials_expected, 0 to 1")
    eta_seconds: float | None = Field(description="time left in the current stage (see current_stage)")
    current_stage: str | None = Field(description="the first stage with trials left")
    stages: list[StageProgressOut]
    counts: dict[str, int] = Field(description="tuning trials by state")
    best: TrialOut | None
    best_perplexity: float | None
    best_family: str | None
    best_possible_perplexity: float | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None

    @classmethod
    def of(cls, study: StudyView) -> StudyOut:
        best, progress = study.best, study.progress
        current = progress.current
        derived = ("best", "best_perplexity", "best_family", "progress", "eta_seconds", "current_stage", "stages")
        return cls(
            **{name: getattr(study, name) for name in cls.model_fields if name not in derived},
            progress=progress.fraction,
            eta_seconds=progress.eta_seconds,
            current_stage=None if current is None else current.stage,
            stages=[StageProgressOut.of(stage) for stage in progress.stages],
            best=None if best is None else TrialOut.of(best),
            best_perplexity=None if best is None else best.perplexity,
            best_family=None if best is None else best.family,
        )


class StudyDetailOut(StudyOut):
    spec: dict[str, Any]


class StudyPage(BaseModel):
    items: list[StudyOut]
    total: int
    limit: int
    offset: int


class TrialPage(BaseModel):
    items: list[TrialOut]
    total: int
    limit: int
    offset: int


class ParetoPoint(BaseModel):
    trial_id: int
    family: str
    number: int
    x: float
    perplexity: float
    score: float  # in the study's unit: perplexity, or bits per character


class ParetoOut(BaseModel):
    x: str
    figure: dict[str, Any]
    non_dominated: list[ParetoPoint]


class StatusOut(BaseModel):
    name: str
    status: str


class SubmittedOut(BaseModel):
    name: str
    status: str
    url: str


class SpecIssueOut(BaseModel):
    field: str
    message: str
    line: int | None


class SpecErrorsOut(BaseModel):
    detail: list[SpecIssueOut]


class EstimateOut(BaseModel):
    mean: float
    std: float
    count: int


class LineageOut(BaseModel):
    checkpoint_trial_id: int
    dyneval_trial_id: int | None
    settings: dict[str, Any]


class FamilyResultOut(BaseModel):
    family: str
    complete_tuning_trials: int
    best_tuning: float | None
    final_trial_ids: list[int]
    valid: EstimateOut | None
    test: EstimateOut | None
    mc_valid: EstimateOut | None
    mc_test: EstimateOut | None
    dynamic_valid: EstimateOut | None
    dynamic_test: EstimateOut | None
    lineage: list[LineageOut]


class ComparisonOut(BaseModel):
    study: str
    unit: str
    families: list[FamilyResultOut]
    winner: str | None
    winner_by: str


class HistoryBest(BaseModel):
    trial_id: int
    number: int
    score: float


class HistoryOut(BaseModel):
    unit: str
    figure: dict[str, Any]
    best: dict[str, HistoryBest]
    counts: dict[str, int]


class CurvesOut(BaseModel):
    unit: str
    trial_ids: list[int]
    averaging_switches: dict[int, list[int]]
    figure: dict[str, Any]


class ParallelOut(BaseModel):
    family: str
    unit: str
    trials: int
    best_trial_id: int | None
    neighbourhood: list[int]
    figure: dict[str, Any]


class ImportanceOut(BaseModel):
    evaluator: str
    importances: dict[str, dict[str, float]]
    figure: dict[str, Any]



IDENTIFIER = r"^[A-Za-z0-9_]+$"  # hyperparameter and family names


class SensitivityIn(BaseModel):
    model_config = ConfigDict(strict=True)  # true is not 1 seed

    parameter: str = Field(max_length=64, pattern=IDENTIFIER,
                           description="the hyperparameter to move (one the family searched)")
    seeds: int = Field(3, ge=1, le=20, description="training seeds per moved value")
    points: int = Field(5, ge=2, le=21, description="moved values across best ± 15% of the range")
    family: str | None = Field(None, max_length=32, pattern=IDENTIFIER,
                               description="whose best to move; default: the best family")


class SensitivityPlanOut(BaseModel):
    study: str
    family: str
    parameter: str
    best_trial_id: int
    best_value: float
    values: list[float]
    seeds: list[int]
    queued: int
    page: str


class EffectPoint(BaseModel):
    family: str
    value: float
    mean: float
    std: float
    count: int


class SensitivityOut(BaseModel):
    parameter: str
    unit: str
    best_values: dict[str, float]
    pending: int
    effect: list[EffectPoint]
    figure: dict[str, Any]
