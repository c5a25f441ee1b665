"""What a training run is configured with: the `Schedule` (how long and in which shape a model is
trained and evaluated, never tuned, with exactly one budget) and the `TrainingConfig` that adds the
tuned optimisation hyperparameters and the seed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from lm_tuner.trainers.averaging import AveragingConfig, NoAveragingConfig
from lm_tuner.trainers.fine_tuning import FineTuningConfig

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
    validation_tokens: int | None = Field(
        None, ge=1, description="score only the first N tokens of the validation split after each turn (the same "
                                "tokens for every trial, turn and family; at least eval_batch_size x (bptt + 1), "
                                "one window per stream), as streams of at least 2,500 tokens (fewer than "
                                "eval_batch_size where needed: each stream starts from a zero state); the best trials "
                                "are scored on the whole split when tuning ends. Unset: the whole split every turn")
    search_temperature: bool = Field(
        True, description="score each turn at the softmax temperature chosen on the first windows it scores "
                          "(about 50,000 tokens; s = 1.06, 1.04, ..., 0.80, stopping after 2 values without "
                          "improvement), as the reference does at every evaluation, so the best turn and the tuning "
                          "objective are at the chosen temperature; false: at temperature 1")
    max_grad_norm: float = Field(10.0, gt=0, description="global gradient-norm clipping threshold")
    optimizer: Literal["adam", "radam", "sgd"] = Field(
        "adam", description="Adam or Rectified Adam, both with beta1 = 0 (Melis et al.), or plain SGD without "
                            "momentum (AWD-LSTM, Merity et al. 2018)")
    averaging: AveragingConfig = Field(NoAveragingConfig(), description="which weights are evaluated")
    fine_tuning: FineTuningConfig = Field(FineTuningConfig(), description="a second stage after the budget: "
                                                                          "off unless enabled")
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

    @model_validator(mode="after")
    def _a_window_per_stream(self) -> Schedule:
        smallest = self.eval_batch_size * (self.bptt + 1)
        if self.validation_tokens is not None and self.validation_tokens < smallest:
            raise ValueError(f"validation_tokens: got {self.validation_tokens}; allowed: at least eval_batch_size x "
                             f"(bptt + 1) = {smallest}, one window for each evaluation stream, or unset to score "
                             f"the whole validation split")
        return self

    @model_serializer(mode="wrap")
    def _without_unused_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave `turns` out where another budget rules, so a dumped schedule validates again, and an unset
        `validation_tokens` and `fine_tuning` when off, so the schedule of a study (or the state of a run) stored
        before those fields existed dumps as it was stored (a relaunch continues a study only when its spec is
        identical, and a run resumes only with the configuration it was saved with)."""
        data = handler(self)
        if any(getattr(self, name) is not None for name in BUDGETS):
            data.pop("turns", None)
        if self.validation_tokens is None:
            data.pop("validation_tokens", None)
        if not self.fine_tuning.enabled:
            data.pop("fine_tuning", None)
        return data


class TrainingConfig(BaseModel):
    """A schedule plus the optimisation hyperparameters of one run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schedule: Schedule = Schedule()
    learning_rate: float = Field(0.003, gt=0, description="learning rate of Adam or RAdam")
    l2_penalty: float = Field(0.0, ge=0, description="coefficient of l2 * sum(theta^2) / 2")
    seed: int = Field(0, description="seeds initialisation, dropout and window lengths")
