"""The read models of studies and trials that the CLI, the API and the dashboard show: plain frozen data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from lm_tuner.tuner.store.progress import (
    StudyProgress,
)

TRIAL_STATES = ("COMPLETE", "RUNNING", "PRUNED", "FAIL", "WAITING")


TRIAL_SORTS = ("number", "value", "family", "state", "started")


SETTLED_STATES = ("COMPLETE", "PRUNED", "FAIL")


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
    value: float | None  # best validation cross-entropy, nats/token (COMPLETE trials only); see val_subset
    params: dict[str, Any]
    hidden_size: int | None
    parameter_count: int | None
    seed: int | None
    fail_reason: str | None
    interrupted: bool  # failed because its controller stopped or the study was cancelled: run again on resume
    turns_reported: int
    wall_seconds: float | None
    last_value: float | None
    checkpoint: CheckpointView | None
    started_at: datetime | None
    finished_at: datetime | None
    train_seconds: float | None  # of wall_seconds: optimisation steps, summed over its turns
    eval_seconds: float | None  # and validation evaluations
    val_tokens: int | None  # validation tokens value and last_value are means over
    val_subset: bool | None  # those are the first tokens of the split only (training.validation_tokens)
    full_value: float | None  # where val_subset: its best checkpoint on the whole split, once scored after tuning
    reversed_loss: float | None  # reverse-copy tasks: its best turn's loss on the reversed halves, else None
    reversed_accuracy: float | None  # and the share of reversed symbols its best turn predicted

    @property
    def perplexity(self) -> float | None:
        return None if self.value is None else math.exp(self.value)

    @property
    def full_perplexity(self) -> float | None:
        return None if self.full_value is None else math.exp(self.full_value)


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
    unigram_perplexity: float | None  # of the validation split; None until its corpus has been read
    corpus_digest: str | None  # SHA-256 of its tokens (Corpus.digest); None until it first runs
    spec: dict[str, Any]
    progress: StudyProgress
    counts: dict[str, int] = field(default_factory=dict)  # tuning trials by state
    best: TrialView | None = None
    warnings: list[str] = field(default_factory=list)  # what its run warned about, oldest first

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
