"""Studies and trials as JSON documents: what `tuner status|list|best --json` print and what the REST API returns
(api.schemas builds its responses on these), so both say the same thing in the same fields."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from lm_tuner.tuner.store.progress import StageProgress
from lm_tuner.tuner.store.views import StudyView, TrialView


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
    train_seconds: float | None = Field(description="of wall_seconds, the optimisation steps (all turns)")
    eval_seconds: float | None = Field(description="of wall_seconds, the validation evaluations (all turns)")
    val_tokens: int | None = Field(description="validation tokens that value and last_value are means over")
    val_subset: bool | None = Field(description="true: value is on the first val_tokens tokens of the validation "
                                                "split only (training.validation_tokens); see full_value")
    full_value: float | None = Field(description="where val_subset: the best checkpoint's loss on the whole "
                                                 "validation split, scored once tuning is over")
    full_perplexity: float | None
    reversed_loss: float | None = Field(description="reverse-copy tasks: the best turn's loss (nats/token) on the "
                                                    "reversed halves, the part that measures memory; else null")
    reversed_accuracy: float | None = Field(description="reverse-copy tasks: the share of reversed symbols the best "
                                                        "turn's weights predict (argmax); else null")

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


class StageProgressOut(BaseModel):
    stage: str = Field(description="tune, rerun or dyneval")
    label: str = Field(description="tuning, reruns or dynamic evaluation")
    planned: int = Field(description="trials the spec asks for in this stage")
    settled: int = Field(description="finished trials that count against the plan (an interrupted trial is run "
                                     "again and does not count); never more than planned")
    running: int
    fraction: float = Field(description="settled / planned, 0 to 1")
    eta_seconds: float | None = Field(description="time the stage's remaining trials need at its finished "
                                                  "trials' mean duration, run `concurrency` at a time (a "
                                                  "compute-budgeted study's tuning: the tokens its rungs still "
                                                  "lack, at each family's pace so far); only for the current "
                                                  "stage of a running study")

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
    corpus_digest: str | None = Field(description="SHA-256 of the study's tokens (vocabulary and the three streams), "
                                                  "recorded when it first ran; a run on other tokens is refused")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None

    @classmethod
    def of(cls, study: StudyView, **given: Any) -> StudyOut:
        """The document of `study`; `given`: the values of fields a subclass adds that the view does not hold."""
        best, progress = study.best, study.progress
        current = progress.current
        derived = ("best", "best_perplexity", "best_family", "progress", "eta_seconds", "current_stage", "stages",
                   *given)
        return cls(
            **given,
            **{name: getattr(study, name) for name in cls.model_fields if name not in derived},
            progress=progress.fraction,
            eta_seconds=progress.eta_seconds,
            current_stage=None if current is None else current.stage,
            stages=[StageProgressOut.of(stage) for stage in progress.stages],
            best=None if best is None else TrialOut.of(best),
            best_perplexity=None if best is None else best.perplexity,
            best_family=None if best is None else best.family,
        )


class BaselineOut(BaseModel):
    """tuner.analysis.study_facts.Baseline: what word frequencies alone score on the validation split."""

    perplexity: float | None = Field(description="the unigram perplexity of the validation split (null: unknown)")
    unknown_because: str | None = Field(description="why it is unknown, e.g. the dataset is not downloaded here")


class StudyDetailOut(StudyOut):
    spec: dict[str, Any]
    warnings: list[str] = Field(description="what the study's run has warned about so far (e.g. evaluation "
                                            "taking more than 25% of a trial's time), oldest first")
    unigram_baseline: BaselineOut = Field(description="the unigram baseline of the study's corpus: a model that "
                                                      "does not beat it has learnt nothing beyond word frequencies")

    @classmethod
    def of(cls, study: StudyView, baseline: BaselineOut) -> StudyDetailOut:
        return super().of(study, unigram_baseline=baseline)
