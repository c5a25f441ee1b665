"""Fine-tuning (Merity et al. 2018, "Regularizing and Optimizing LSTM Language Models", section 5; the reference's
finetune.py): after the main training, train again from the best weights with a fresh optimiser that averages from
its very first step (ASGD with t0 = 0), scoring the running average after every turn, until the non-monotone
trigger fires or the fine-tuning budget is used. The best weights over the whole run stay the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor

from lm_tuner.trainers.averaging_protocol import Evaluated, LossOf, RunningAverage, Weights
from lm_tuner.trainers.triggered_averaging import non_monotone_trigger


class FineTuningConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="after the main training, fine-tune from its best weights, averaging "
                                             "from the first step (AWD-LSTM's finetune.py); the best weights of "
                                             "either stage are the result")
    interval: int = Field(5, ge=1, description="non-monotone interval n: fine-tuning stops after an evaluation worse "
                                               "than the best of its evaluations before the last n")
    turns: int | None = Field(None, ge=1, description="at most this many fine-tuning turns of steps_per_turn steps "
                                                      "if the trigger has not fired; unset: as many turns as the "
                                                      "main training took")

    @model_validator(mode="after")
    def _options_need_it_enabled(self) -> FineTuningConfig:
        options = sorted(self.model_fields_set - {"enabled"})
        if options and not self.enabled:
            raise ValueError(f"{' and '.join(options)} given, but fine-tuning is off: set enabled: true, or remove "
                             f"{'them' if len(options) > 1 else 'it'}")
        return self


class FineTuningAveraging:
    """The uniform average of every iterate since fine-tuning began, scored at each evaluation; `stopped` once an
    evaluation triggers the non-monotone criterion over the fine-tuning evaluations (the main run's do not count,
    as in finetune.py)."""

    def __init__(self, like: Sequence[Tensor], interval: int) -> None:
        self.average = RunningAverage(like)
        self.trigger = non_monotone_trigger(interval)
        self.history: list[float] = []

    @property
    def stopped(self) -> bool:
        return bool(self.history) and self.trigger(self.history, 0.0)

    def add(self, weights: Sequence[Tensor]) -> None:
        self.average.add(weights)

    def evaluate(self, raw: Weights, loss_of: LossOf, progress: float) -> Evaluated:
        loss = loss_of(self.average.mean)
        self.history.append(loss)
        return Evaluated(loss, self.average.mean, self.average.count)

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "average": self.average.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = list(state["history"])
        self.average.load_state_dict(state["average"])
