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
    progress: StudyProgress
    counts: dict[str, int] = field(default_factory=dict)  # tuning trials by state
    best: TrialView | None = None

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
