"""What a training run reports: a `TurnReport` after every turn (handed to a `TurnCallback`) and the
`TrainingResult` at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TurnReport:
    turn: int
    step: int
    train_loss: float
    val_loss: float
    best_val_loss: float
    improved: bool
    tokens_per_second: float
    wall_seconds: float
    process_seconds: float = 0.0
    """CPU time of the training process so far, all threads."""
    averaging_length: int = 1
    """Iterates averaged in the evaluated weights (1: the raw weights)."""
    learning_rate: float | None = None
    divergences: int = 0
    """Restarts from the last good state so far."""
    epochs: float = 0.0
    """Passes over the training split so far."""
    final: bool = False
    """The budget is used up: this is the last turn."""
    train_seconds: float = 0.0
    """Wall-clock seconds of this turn's optimisation steps."""
    eval_seconds: float = 0.0
    """Wall-clock seconds of this turn's validation evaluation."""
    val_tokens: int = 0
    """Validation tokens `val_loss` is the mean over."""
    val_subset: bool = False
    """`val_loss` covers only the first tokens of the validation split (the schedule's `validation_tokens`)."""
    reversed_loss: float | None = None
    """Reverse-copy tasks: the loss on the reversed halves of the scored validation examples (what the model
    remembers), next to `val_loss` on every token; None for other corpora."""
    reversed_accuracy: float | None = None
    """Reverse-copy tasks: the share of reversed symbols the evaluated weights predict (argmax); else None."""
    val_logit_scale: float = 1.0
    """`val_loss` (and `reversed_loss`) were scored with the logits multiplied by this (1 / softmax temperature)."""
    checkpoint_seconds: float = 0.0
    """Wall-clock seconds of this turn's checkpoint writes (the best weights, the latest training state)."""
    setup_seconds: float = 0.0
    """The first turn a process reports: wall-clock seconds it took to build the model, restore a resumed state
    and load the compiled kernels before training began; 0 on later turns."""
    checkpoint_sha256: str | None = None
    """An improved turn that wrote the best checkpoint: the written file's SHA-256 (hex); else None."""
    checkpoint_bytes: int | None = None
    """Its size in bytes, with `checkpoint_sha256`."""
    tokens: int = 0
    """Training tokens (targets) the run's optimisation steps have consumed so far, over all its turns."""
    fine_tuning: bool = False
    """A turn of the fine-tuning stage that follows the main budget (schedule `fine_tuning`); its `val_loss` is of the
    average of every fine-tuning step so far."""


@dataclass(frozen=True)
class TrainingResult:
    best_val_loss: float
    best_turn: int
    parameter_count: int
    turns: list[TurnReport]


TurnCallback = Callable[[TurnReport], None]
