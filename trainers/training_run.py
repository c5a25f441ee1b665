"""One training run as a single state: the model, the optimiser, the averaging strategy, the token
stream, the carried hidden state, the random generators and the counters. `TrainingRun` takes
optimisation steps in turns, evaluates, measures the budget used, detects divergence (NaN or
infinite losses) and recovers from it, moves on to fine-tuning when the schedule asks for it, and
saves, restores and resumes exactly.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lm_tuner.models import LanguageModel, ModelConfig, detach_state
from lm_tuner.trainers.averaging import Averaging, Evaluated, Weights, make_averaging
from lm_tuner.trainers.batching import TrainingStream, batchify
from lm_tuner.trainers.checkpoint import load_training_state
from lm_tuner.trainers.corpus import Corpus
from lm_tuner.trainers.evaluation import scored_tokens, streams_cross_entropy
from lm_tuner.trainers.fine_tuning import FineTuningAveraging
from lm_tuner.trainers.objective import activation_regularisation, multi_sample_nll
from lm_tuner.trainers.optimizers import make_optimizer
from lm_tuner.trainers.stopwatch import Stopwatch
from lm_tuner.trainers.temperature import searched_streams_cross_entropy
from lm_tuner.trainers.training_config import TrainingConfig
from lm_tuner.trainers.training_reports import TurnReport
from lm_tuner.trainers.validation_cut import validation_cut
from lm_tuner.trainers.weight_swap import swapped_weights

LEARNING_RATE_BACKOFF = 0.9
"""Divergence recovery multiplies the learning rate by this (Melis thesis, section 4.4)."""


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
        self.averaging: Averaging = make_averaging(schedule.averaging, self.params)
        cut = validation_cut(schedule, corpus.valid.numel())  # the first N tokens, the same in every run
        self.validation_subset = cut.subset
        self.validation = batchify(corpus.valid[:cut.tokens], cut.streams).to(device)  # cut once, scored every turn
        self.rows = schedule.batch_size * schedule.dropout_samples  # every stream once per dropout sample
        self.hidden = self.model.initial_state(self.rows)
        self.step = self.turn = self.best_turn = self.divergences = 0
        self.tokens = 0  # training targets consumed by the optimisation steps so far
        self.validation_passes = 0  # weights scored on the validation streams, by every evaluation so far
        self.best_val_loss = math.inf
        self.best_weights: Weights | None = None  # kept only for fine-tuning to start from
        self.fine_tuning_from: tuple[int, int] | None = None  # the step and turn the main training ended at
        self.reports: list[TurnReport] = []
        self.stopwatch = Stopwatch()

    @property
    def learning_rate(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    @property
    def fine_tuning(self) -> bool:
        """Whether the run is in its fine-tuning stage."""
        return self.fine_tuning_from is not None

    def progress(self) -> float:
        """The fraction of the budget used so far: of the fine-tuning stage's, while fine-tuning."""
        schedule = self.schedule
        if self.fine_tuning_from is not None:
            start_step, main_turns = self.fine_tuning_from
            turns = schedule.fine_tuning.turns or main_turns
            return (self.step - start_step) / (turns * schedule.steps_per_turn)
        if schedule.budget_seconds is not None:
            seconds = self.stopwatch.wall() if schedule.clock == "wall" else self.stopwatch.process()
            return seconds / schedule.budget_seconds
        if schedule.budget_epochs is not None:
            return self.stream.epochs / schedule.budget_epochs
        steps = schedule.budget_steps or schedule.turns * schedule.steps_per_turn
        return self.step / steps

    def finished(self) -> bool:
        """Whether the run is over: its budget used and no fine-tuning to follow, or fine-tuning stopped by its
        trigger or its budget."""
        if isinstance(self.averaging, FineTuningAveraging):
            return self.averaging.stopped or self.progress() >= 1
        return self.progress() >= 1 and not self.schedule.fine_tuning.enabled

    def record_best(self, evaluated: Evaluated) -> None:
        """`evaluated` scored the best validation loss so far (kept as the weights fine-tuning would start from)."""
        self.best_val_loss, self.best_turn = evaluated.loss, self.turn
        if self.schedule.fine_tuning.enabled and not self.fine_tuning:
            if self.best_weights is None:
                self.best_weights = [tensor.detach().clone() for tensor in evaluated.weights]
            else:
                torch._foreach_copy_(self.best_weights, evaluated.weights)

    def start_fine_tuning_when_due(self) -> None:
        """Once the main budget is used, when the schedule asks for fine-tuning: from the best weights, with a fresh
        optimiser at the current learning rate, a fresh hidden state, and an average of every step from the first."""
        if self.fine_tuning or not self.schedule.fine_tuning.enabled or self.progress() < 1:
            return
        assert self.best_weights is not None, "a finished main training has scored at least one turn"
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.best_weights)
        self.best_weights = None
        self._enter_stage((self.step, self.turn))
        self.hidden = self.model.initial_state(self.rows)

    def _enter_stage(self, fine_tuning_from: tuple[int, int] | None) -> None:
        """A fresh optimiser at the current learning rate and the averaging of the main training (None) or of
        fine-tuning that began at (step, turn)."""
        self.fine_tuning_from = fine_tuning_from
        self.optimizer = make_optimizer(self.schedule.optimizer, self.params, self.learning_rate)
        self.averaging = make_averaging(self.schedule.averaging, self.params) if fine_tuning_from is None else \
            FineTuningAveraging(self.params, self.schedule.fine_tuning.interval)

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
            self.tokens += targets.numel()
            if self.progress() >= 1:
                break
        self.turn += 1
        return loss_sum / tokens, tokens / (time.perf_counter() - started)

    def _step(self, inputs: Tensor, targets: Tensor) -> float:
        self.step += 1
        self.hidden = detach_state(self.hidden)
        nll, self.hidden = multi_sample_nll(self.model, inputs, targets, self.hidden, self.schedule.dropout_samples)
        loss = nll.sum(dim=0).mean()  # summed over the window, averaged over the batch
        if (penalty := activation_regularisation(self.model)) is not None:
            loss = loss + nll.shape[0] * penalty  # per token, so times the window's length like the summed loss
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
        """The weights the averaging strategy reports, with their loss at the temperature chosen for them."""
        scored: list[tuple[Weights, float]] = []  # the weights loss_of saw, each with its logit scale

        def loss_of(weights: Weights) -> float:
            loss, logit_scale = self._validation_loss(weights)
            scored.append((weights, logit_scale))
            return loss

        evaluated = self.averaging.evaluate(self.params, loss_of, self.progress())
        if not math.isfinite(evaluated.loss):
            raise Diverged(f"after step {self.step} the validation loss is {evaluated.loss}")
        return replace(evaluated, logit_scale=next(scale for weights, scale in scored if weights is evaluated.weights))

    @property
    def validation_tokens(self) -> int:
        """Tokens each evaluation scores."""
        return scored_tokens(self.validation)

    def _validation_loss(self, weights: Sequence[Tensor]) -> tuple[float, float]:
        """The loss of `weights` on the validation tokens a turn scores, and the logit scale it is at: the one
        chosen on the first windows of those tokens (docs/methodology.md, "Softmax temperature"), else 1."""
        self.validation_passes += 1
        with swapped_weights(self.model, weights):
            if not self.schedule.search_temperature:
                return streams_cross_entropy(self.model, self.validation, self.schedule.bptt), 1.0
            searched = searched_streams_cross_entropy(self.model, self.validation, self.schedule.bptt)
            return searched.loss, searched.logit_scale

    def recover(self, good_state: dict[str, Any]) -> None:
        """Back to `good_state` (time keeps running) with the learning rate at 0.9^k of the configured one after the
        k-th divergence, whichever state it goes back to (retries from the same state compound: 0.9, 0.81, ...),
        and with fresh random numbers, so that the retried steps draw new dropout masks instead of replaying the
        ones that diverged."""
        divergences = self.divergences + 1
        self.load_state_dict(good_state)
        self.divergences = divergences
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.learning_rate * LEARNING_RATE_BACKOFF ** divergences
        torch.manual_seed(retry_seed(self.config.seed, divergences))  # seeds every device's generator

    def resume(self, path: Path) -> None:
        state, _ = load_training_state(path)
        # The saved model is read through ModelConfig, so a model field added since (a family's own, at its neutral
        # default) is no difference; the training configuration must match as saved: a new training setting can
        # change the objective, which must not switch halfway through a run.
        differences = _differences(
            {"model": self.model_config.to_dict(), "training": self.config.model_dump()},
            {"model": ModelConfig.from_dict(state["model_config"]).to_dict(), "training": state["training"]},
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
            "tokens": self.tokens,
            "turn": self.turn,
            "best_val_loss": self.best_val_loss,
            "best_turn": self.best_turn,
            "best_weights": None if self.best_weights is None else [tensor.clone() for tensor in self.best_weights],
            "fine_tuning_from": self.fine_tuning_from,
            "reports": [asdict(report) for report in self.reports],
            "divergences": self.divergences,
            "stopwatch": self.stopwatch.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Everything that decides the numbers of the rest of the run (not the clocks, not the divergence count)."""
        # a divergence in the first fine-tuning turn goes back to the main training's last state, which starts it anew
        saved_start = state.get("fine_tuning_from")  # absent from states saved before fine-tuning existed
        fine_tuning_from = None if saved_start is None else (saved_start[0], saved_start[1])
        if fine_tuning_from != self.fine_tuning_from:
            self._enter_stage(fine_tuning_from)  # the stage's optimiser and averaging, their state loaded below
        self.model.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))  # the optimiser would share its tensors
        self.averaging.load_state_dict(state["averaging"])
        self.stream.load_state_dict(state["stream"])
        self.hidden = [tuple(tensor.to(self.device, copy=True) for tensor in layer) for layer in state["hidden"]]
        torch.set_rng_state(state["rng"])
        if state["cuda_rng"] is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self.step, self.turn = state["step"], state["turn"]
        self.tokens = state.get("tokens", 0)  # absent from states saved before tokens were counted
        self.best_val_loss, self.best_turn = state["best_val_loss"], state["best_turn"]
        best_weights = state.get("best_weights")
        self.best_weights = None if best_weights is None else [tensor.to(self.device, copy=True)
                                                               for tensor in best_weights]
        self.reports = [TurnReport(**report) for report in state["reports"]]


def retry_seed(seed: int, divergences: int) -> int:
    """The random seed of the steps retried after the `divergences`-th divergence of a run seeded with `seed`."""
    return int(np.random.SeedSequence([seed, divergences]).generate_state(1)[0])


def _differences(expected: dict[str, Any], found: dict[str, Any], prefix: str = "") -> list[str]:
    differences = []
    for key in sorted(set(expected) | set(found)):
        mine, theirs = expected.get(key), found.get(key)
        if isinstance(mine, dict) and isinstance(theirs, dict):
            differences += _differences(mine, theirs, f"{prefix}{key}.")
        elif mine != theirs:
            differences.append(f"{prefix}{key}: {theirs!r} there, {mine!r} here")
    return differences
