"""The training loop: turns of optimisation steps, each followed by a validation evaluation.

The best validation score over turns is the run's result, and its weights are kept as the best
checkpoint. Progress leaves through a callback, so this module knows nothing about who listens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from models import LanguageModel, ModelConfig, count_parameters, detach_state
from trainers.batching import batchify, windows
from trainers.checkpoint import save_checkpoint
from trainers.corpus import Corpus
from trainers.evaluation import cross_entropy


class Schedule(BaseModel):
    """How long and in which shape a model is trained and evaluated (never tuned)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: int = Field(10, ge=1, description="validation evaluations; the best one is the result")
    steps_per_turn: int = Field(100, ge=1, description="optimisation steps between evaluations")
    batch_size: int = Field(32, ge=1, description="parallel token streams")
    bptt: int = Field(35, ge=2, description="window length of truncated backpropagation through time")
    eval_batch_size: int = Field(16, ge=1, description="parallel streams when evaluating")
    max_grad_norm: float = Field(10.0, gt=0, description="global gradient-norm clipping threshold")


class TrainingConfig(BaseModel):
    """A schedule plus the optimisation hyperparameters of one run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schedule: Schedule = Schedule()
    learning_rate: float = Field(0.003, gt=0, description="Adam learning rate (beta1 = 0)")
    l2_penalty: float = Field(0.0, ge=0, description="coefficient of l2 * sum(theta^2) / 2")
    seed: int = Field(0, description="seeds initialisation and dropout")


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


@dataclass(frozen=True)
class TrainingResult:
    best_val_loss: float
    best_turn: int
    parameter_count: int
    turns: list[TurnReport]


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


TurnCallback = Callable[[TurnReport], None]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train(
    model_config: ModelConfig,
    config: TrainingConfig,
    corpus: Corpus,
    *,
    checkpoint_path: Path | None = None,
    metadata: dict[str, Any] | None = None,
    on_turn: TurnCallback | None = None,
    device: torch.device | None = None,
) -> TrainingResult:
    """Train for `config.schedule.turns` turns; save the best-validation weights to `checkpoint_path`."""
    device = device or default_device()
    schedule = config.schedule
    torch.manual_seed(config.seed)
    model = LanguageModel(model_config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, betas=(0.0, 0.999), eps=1e-8)
    batched = batchify(corpus.train, schedule.batch_size).to(device)
    batches = _endless_windows(batched, schedule.bptt)
    state = model.initial_state(schedule.batch_size)
    reports: list[TurnReport] = []
    best_val_loss, best_turn, step = math.inf, 0, 0
    started = time.perf_counter()
    for turn in range(1, schedule.turns + 1):
        model.train()
        turn_started, loss_sum, token_count = time.perf_counter(), 0.0, 0
        for _ in range(schedule.steps_per_turn):
            (inputs, targets), restarted = next(batches)
            if restarted:
                state = model.initial_state(schedule.batch_size)
            step += 1
            token_loss, state = _optimisation_step(model, optimizer, config, inputs, targets, state)
            if not math.isfinite(token_loss):
                raise TrainingDiverged(f"training diverged at step {step} (turn {turn}): loss is {token_loss}")
            loss_sum += token_loss * targets.numel()
            token_count += targets.numel()
        tokens_per_second = token_count / (time.perf_counter() - turn_started)
        val_loss = cross_entropy(model, corpus.valid, schedule.eval_batch_size, schedule.bptt)
        improved = val_loss < best_val_loss
        if improved:
            best_val_loss, best_turn = val_loss, turn
            if checkpoint_path is not None:
                save_checkpoint(checkpoint_path, model, corpus.vocabulary, {
                    **(metadata or {}),
                    "val_loss": val_loss,
                    "turn": turn,
                    "step": step,
                    "training": config.model_dump(),
                })
        report = TurnReport(turn, step, loss_sum / token_count, val_loss, best_val_loss, improved,
                            tokens_per_second, time.perf_counter() - started)
        reports.append(report)
        if on_turn is not None:
            on_turn(report)
    return TrainingResult(best_val_loss, best_turn, count_parameters(model_config), reports)


def _optimisation_step(model, optimizer, config, inputs, targets, state):
    state = detach_state(state)
    logits, state = model(inputs, state)
    token_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    # Sum over the window, mean over the batch: the gradient scales with the window length.
    loss = token_loss * inputs.shape[0]
    if config.l2_penalty > 0:
        loss = loss + config.l2_penalty * sum(p.pow(2).sum() for p in model.parameters()) / 2
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.schedule.max_grad_norm)
    optimizer.step()
    return token_loss.item(), state


def _endless_windows(batched: torch.Tensor, bptt: int):
    """Windows in order, forever; flags the first window of each pass so the state can be reset."""
    while True:
        restarted = True
        for window in windows(batched, bptt):
            yield window, restarted
            restarted = False
