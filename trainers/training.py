"""The training loop: turns of optimisation steps, each followed by a validation evaluation.

The best validation score over turns is the run's result, and the weights that scored it (averaged
ones when an averaging strategy reports them) are kept as the best checkpoint. Progress leaves
through a callback, so this module knows nothing about who listens.

A run is budgeted in turns, steps, epochs or wall-clock seconds. When the loss becomes NaN or
infinite, the run goes back to the state it had at the end of the last good turn, multiplies the
learning rate by 0.9 and carries on, at most `divergence_retries` times; then it fails with the
reason. After every turn the whole training state can be written to a latest checkpoint, from
which `train(..., resume_from=...)` continues to exactly the numbers of an uninterrupted run.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator
from torch import Tensor

from lm_tuner.models import LanguageModel, ModelConfig, count_parameters, detach_state
from lm_tuner.trainers.averaging import AveragingConfig, Evaluated, NoAveragingConfig, make_averaging
from lm_tuner.trainers.batching import TrainingStream, batchify
from lm_tuner.trainers.checkpoint import load_training_state, save_checkpoint
from lm_tuner.trainers.corpus import Corpus
from lm_tuner.trainers.evaluation import cross_entropy
from lm_tuner.trainers.objective import multi_sample_nll

LEARNING_RATE_BACKOFF = 0.9
"""Divergence recovery multiplies the learning rate by this (Melis thesis, section 4.4)."""

BUDGETS = ("budget_steps", "budget_epochs", "budget_seconds")


class Schedule(BaseModel):
    """How long and in which shape a model is trained and evaluated (never tuned)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: int = Field(10, ge=1, description="budget in turns of steps_per_turn steps, unless a budget_* is given")
    steps_per_turn: int = Field(100, ge=1, description="optimisation steps between evaluations")
    budget_steps: int | None = Field(None, ge=1, description="budget in optimisation steps")
    budget_epochs: float | None = Field(None, gt=0, description="budget in passes over the training split")
    budget_seconds: float | None = Field(None, gt=0, description="budget in seconds of `clock`, evaluations included")
    clock: Literal["wall", "process"] = Field(
        "wall", description="what budget_seconds counts: wall-clock time, or the CPU time of the training process "
                            "(all its threads), which other load on the machine does not eat into")
    batch_size: int = Field(32, ge=1, description="parallel token streams")
    bptt: int = Field(35, ge=2, description="window length of truncated backpropagation through time")
    variable_bptt: bool = Field(False, description="draw window lengths around bptt as AWD-LSTM does")
    eval_batch_size: int = Field(16, ge=1, description="parallel streams when evaluating")
    max_grad_norm: float = Field(10.0, gt=0, description="global gradient-norm clipping threshold")
    optimizer: Literal["adam", "radam"] = Field("adam", description="Adam or Rectified Adam, both with beta1 = 0")
    averaging: AveragingConfig = Field(NoAveragingConfig(), description="which weights are evaluated")
    dropout_samples: int = Field(1, ge=1, description="D of the multi-sample dropout objective")
    divergence_retries: int = Field(3, ge=0, description="restarts from the last good state before failing")

    @model_validator(mode="after")
    def _one_budget(self) -> Schedule:
        given = [name for name in BUDGETS if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are all budgets; give one")
        if given and "turns" in self.model_fields_set:
            raise ValueError(f"turns and {given[0]} are both budgets; give one")
        return self

    @model_serializer(mode="wrap")
    def _without_unused_turns(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave `turns` out where another budget rules, so a dumped schedule validates again."""
        data = handler(self)
        if any(getattr(self, name) is not None for name in BUDGETS):
            data.pop("turns", None)
        return data


class TrainingConfig(BaseModel):
    """A schedule plus the optimisation hyperparameters of one run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schedule: Schedule = Schedule()
    learning_rate: float = Field(0.003, gt=0, description="learning rate of Adam or RAdam")
    l2_penalty: float = Field(0.0, ge=0, description="coefficient of l2 * sum(theta^2) / 2")
    seed: int = Field(0, description="seeds initialisation, dropout and window lengths")


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


@dataclass(frozen=True)
class TrainingResult:
    best_val_loss: float
    best_turn: int
    parameter_count: int
    turns: list[TurnReport]


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite and restarting from the last good state did not help."""


TurnCallback = Callable[[TurnReport], None]


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train(
    model_config: ModelConfig,
    config: TrainingConfig,
    corpus: Corpus,
    *,
    checkpoint_path: Path | None = None,
    latest_checkpoint_path: Path | None = None,
    resume_from: Path | None = None,
    metadata: dict[str, Any] | None = None,
    on_turn: TurnCallback | None = None,
    device: torch.device | None = None,
) -> TrainingResult:
    """Train within the schedule's budget; keep the best-validation weights at `checkpoint_path`.

    `latest_checkpoint_path` receives the full training state after every turn; `resume_from` (such
    a file) continues that run, which must have the same model and training configuration.
    """
    run = TrainingRun(model_config, config, corpus, device or default_device())
    if resume_from is not None:
        run.resume(Path(resume_from))
    metadata = metadata or {}
    last_good = run.state_dict()
    finished = run.progress() >= 1
    while not finished:
        try:
            train_loss, tokens_per_second = run.train_turn()
            evaluated = run.evaluate()
        except Diverged as divergence:
            if run.divergences == config.schedule.divergence_retries:
                raise TrainingDiverged(
                    f"training diverged: {divergence}; gave up after {run.divergences} restart(s) from the last "
                    f"good state, each with the learning rate x{LEARNING_RATE_BACKOFF}; lower learning_rate or "
                    f"raise divergence_retries"
                ) from None
            run.recover(last_good)
            continue
        improved = evaluated.loss < run.best_val_loss
        finished = run.progress() >= 1
        if improved:
            run.best_val_loss, run.best_turn = evaluated.loss, run.turn
        report = TurnReport(
            run.turn, run.step, train_loss, evaluated.loss, run.best_val_loss, improved, tokens_per_second,
            run.stopwatch.wall(), process_seconds=run.stopwatch.process(), averaging_length=evaluated.length,
            learning_rate=run.learning_rate, divergences=run.divergences, epochs=run.stream.epochs, final=finished,
        )
        run.reports.append(report)
        last_good = run.state_dict()
        turn_metadata = {**metadata, "val_loss": evaluated.loss, "turn": run.turn, "step": run.step,
                         "averaging_length": evaluated.length, "training": config.model_dump()}
        with swapped_weights(run.model, evaluated.weights):
            if improved and checkpoint_path is not None:
                save_checkpoint(checkpoint_path, run.model, corpus.vocabulary, turn_metadata)
            if latest_checkpoint_path is not None:
                save_checkpoint(latest_checkpoint_path, run.model, corpus.vocabulary, turn_metadata,
                                training_state=last_good)
        if on_turn is not None:
            on_turn(report)
    return TrainingResult(run.best_val_loss, run.best_turn, count_parameters(model_config), list(run.reports))


class Diverged(Exception):
    """A NaN or infinite loss or gradient norm (recovered from by `train` when retries are left)."""


class TrainingRun:
    """The model, the optimiser and everything else that changes while training, as one state that
    can be saved, restored after a divergence, and resumed in another process."""

    def __init__(self, model_config: ModelConfig, config: TrainingConfig, corpus: Corpus,
                 device: torch.device) -> None:
        schedule = config.schedule
        self.model_config, self.config, self.schedule, self.corpus = model_config, config, schedule, corpus
        self.device = device
        torch.manual_seed(config.seed)
        self.model = LanguageModel(model_config).to(device)
        self.params = list(self.model.parameters())
        self.optimizer = make_optimizer(schedule.optimizer, self.params, config.learning_rate)
        self.stream = TrainingStream(batchify(corpus.train, schedule.batch_size).to(device), schedule.bptt,
                                     variable_length=schedule.variable_bptt,
                                     generator=torch.Generator().manual_seed(config.seed))
        self.averaging = make_averaging(schedule.averaging, self.params)
        self.rows = schedule.batch_size * schedule.dropout_samples  # every stream once per dropout sample
        self.hidden = self.model.initial_state(self.rows)
        self.step = self.turn = self.best_turn = self.divergences = 0
        self.best_val_loss = math.inf
        self.reports: list[TurnReport] = []
        self.stopwatch = Stopwatch()

    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def progress(self) -> float:
        """The fraction of the budget used so far."""
        schedule = self.schedule
        if schedule.budget_seconds is not None:
            seconds = self.stopwatch.wall() if schedule.clock == "wall" else self.stopwatch.process()
            return seconds / schedule.budget_seconds
        if schedule.budget_epochs is not None:
            return self.stream.epochs / schedule.budget_epochs
        steps = schedule.budget_steps or schedule.turns * schedule.steps_per_turn
        return self.step / steps

    def train_turn(self) -> tuple[float, float]:
        """Steps until the turn (or the budget) ends: the mean training loss per token, and tokens per second."""
        self.model.train()
        started = time.perf_counter()
        loss_sum, tokens = 0.0, 0
        for _ in range(self.schedule.steps_per_turn):
            inputs, targets, starts_pass = self.stream.next_window()
            if starts_pass:
                self.hidden = self.model.initial_state(self.rows)
            loss_sum += self._step(inputs, targets) * targets.numel()
            tokens += targets.numel()
            if self.progress() >= 1:
                break
        self.turn += 1
        return loss_sum / tokens, tokens / (time.perf_counter() - started)

    def _step(self, inputs: Tensor, targets: Tensor) -> float:
        self.step += 1
        self.hidden = detach_state(self.hidden)
        nll, self.hidden = multi_sample_nll(self.model, inputs, targets, self.hidden, self.schedule.dropout_samples)
        loss = nll.sum(dim=0).mean()  # summed over the window, averaged over the batch
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.l2_penalty > 0:
            with torch.no_grad():  # the gradient of l2 * sum(theta^2) / 2, added before clipping
                torch._foreach_add_([p.grad for p in self.params], self.params, alpha=self.config.l2_penalty)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.schedule.max_grad_norm).item()
        token_loss = nll.detach().mean().item()
        if not (math.isfinite(token_loss) and math.isfinite(norm)):
            raise Diverged(f"at step {self.step} the training loss is {token_loss} and the gradient norm {norm}")
        self.optimizer.step()
        self.averaging.add(self.params)
        return token_loss

    def evaluate(self) -> Evaluated:
        evaluated = self.averaging.evaluate(self.params, self._validation_loss, self.progress())
        if not math.isfinite(evaluated.loss):
            raise Diverged(f"after step {self.step} the validation loss is {evaluated.loss}")
        return evaluated

    def _validation_loss(self, weights: Sequence[Tensor]) -> float:
        with swapped_weights(self.model, weights):
            return cross_entropy(self.model, self.corpus.valid, self.schedule.eval_batch_size, self.schedule.bptt)

    def recover(self, good_state: dict[str, Any]) -> None:
        """Back to `good_state` (time keeps running), with the learning rate x0.9."""
        divergences = self.divergences + 1
        self.load_state_dict(good_state)
        self.divergences = divergences
        for group in self.optimizer.param_groups:
            group["lr"] *= LEARNING_RATE_BACKOFF

    def resume(self, path: Path) -> None:
        state, _ = load_training_state(path)
        differences = _differences(
            {"model": self.model_config.to_dict(), "training": self.config.model_dump()},
            {"model": state["model_config"], "training": state["training"]},
        )
        if differences:
            raise ValueError(f"resume_from: {path} is a run with another configuration ({'; '.join(differences)}); "
                             f"resume it with its own configuration or start a new run")
        self.load_state_dict(state)
        self.divergences = state["divergences"]
        self.stopwatch.load_state_dict(state["stopwatch"])

    def state_dict(self) -> dict[str, Any]:
        return {
            "model_config": self.model_config.to_dict(),
            "training": self.config.model_dump(),
            "weights": {name: tensor.clone() for name, tensor in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "averaging": self.averaging.state_dict(),
            "stream": self.stream.state_dict(),
            "hidden": [tuple(tensor.clone() for tensor in layer) for layer in self.hidden],
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "step": self.step,
            "turn": self.turn,
            "best_val_loss": self.best_val_loss,
            "best_turn": self.best_turn,
            "reports": [asdict(report) for report in self.reports],
            "divergences": self.divergences,
            "stopwatch": self.stopwatch.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Everything that decides the numbers of the rest of the run (not the clocks, not the divergence count)."""
        self.model.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # the optimiser would share its tensors
        self.averaging.load_state_dict(state["averaging"])
        self.stream.load_state_dict(state["stream"])
        self.hidden = [tuple(tensor.to(self.device, copy=True) for tensor in layer) for layer in state["hidden"]]
        torch.set_rng_state(state["rng"])
        if state["cuda_rng"] is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.step, self.turn = state["step"], state["turn"]
        self.best_val_loss, self.best_turn = state["best_val_loss"], state["best_turn"]
        self.reports = [TurnReport(**report) for report in state["reports"]]


class Stopwatch:
    """Wall-clock and process CPU seconds of a run, counted on across resumptions."""

    def __init__(self) -> None:
        self.wall_before = self.process_before = 0.0
        self.restart()

    def restart(self) -> None:
        self.wall_started, self.process_started = time.perf_counter(), time.process_time()

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.wall_started

    def process(self) -> float:
        return self.process_before + time.process_time() - self.process_started

    def state_dict(self) -> dict[str, float]:
        return {"wall": self.wall(), "process": self.process()}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.wall_before, self.process_before = state["wall"], state["process"]
        self.restart()


def make_optimizer(name: str, params: Sequence[Tensor], learning_rate: float) -> torch.optim.Optimizer:
    """Adam or RAdam with beta1 = 0 (RMSProp-like, as in Melis et al.), beta2 = 0.999, epsilon = 1e-8."""
    optimizer = {"adam": torch.optim.Adam, "radam": torch.optim.RAdam}[name]
    return optimizer(params, lr=learning_rate, betas=(0.0, 0.999), eps=1e-8)


@contextmanager
def swapped_weights(model: LanguageModel, weights: Sequence[Tensor]) -> Iterator[LanguageModel]:
    """The model with `weights` in place of its parameters inside the block (a no-op for its own)."""
    params = list(model.parameters())
    if all(weight is param for weight, param in zip(weights, params, strict=True)):
        yield model
        return
    saved = [param.detach().clone() for param in params]
    with torch.no_grad():
        for param, weight in zip(params, weights, strict=True):
            param.copy_(weight)
    try:
        yield model
    finally:
        with torch.no_grad():
            for param, value in zip(params, saved, strict=True):
                param.copy_(value)


def _differences(expected: dict[str, Any], found: dict[str, Any], prefix: str = "") -> list[str]:
    differences = []
    for key in sorted(set(expected) | set(found)):
        mine, theirs = expected.get(key), found.get(key)
        if isinstance(mine, dict) and isinstance(theirs, dict):
            differences += _differences(mine, theirs, f"{prefix}{key}.")
        elif mine != theirs:
            differences.append(f"{prefix}{key}: {theirs!r} there, {mine!r} here")
    return differences
