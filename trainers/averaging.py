"""Weight averaging: which weights are evaluated at the end of each turn.

Three interchangeable strategies average the iterates of the optimiser (the raw weights keep
training unchanged):
- triggered tail averaging (Melis et al. 2020): a uniform average starts after `patience` turns
  without improvement, or once `latest_start` of the budget is used;
- NT-ASGD (Merity et al. 2017): the same with a non-monotone trigger;
- Two-Tailed Averaging (Melis 2022, thesis ch. 3, Algorithms 1 and 2): a short and a long running
  average whose lengths adapt to the validation loss; no trigger at all.

Every strategy sees each new iterate through `add` and, at each evaluation, calls `loss_of` on the
weights it wants scored, then returns the weights to report (and to checkpoint if they are best).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

Weights = list[Tensor]
LossOf = Callable[[Weights], float]


@dataclass(frozen=True)
class Evaluated:
    """The weights a strategy reports at an evaluation, their loss, and how many iterates they average
    (1: the raw weights). The weights may be the strategy's own running buffers: use them before the
    next `add`."""

    loss: float
    weights: Weights
    length: int


class Averaging(Protocol):
    def add(self, weights: Sequence[Tensor]) -> None:
        """Take in the latest iterate of the optimiser."""

    def evaluate(self, raw: Weights, loss_of: LossOf, progress: float) -> Evaluated:
        """Score candidate weights with `loss_of`; `progress` is the fraction of the budget used."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RunningAverage:
    """The uniform average of the iterates added since the last reset."""

    def __init__(self, like: Sequence[Tensor]) -> None:
        self.mean = [tensor.detach().clone() for tensor in like]
        self.count = 0

    def add(self, weights: Sequence[Tensor]) -> None:
        self.count += 1
        torch._foreach_lerp_(self.mean, [w.detach() for w in weights], 1.0 / self.count)

    def reset(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": [tensor.clone() for tensor in self.mean]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]
        for tensor, saved in zip(self.mean, state["mean"], strict=True):
            tensor.copy_(saved)


class NoAveraging:
    """Evaluate the raw weights, always."""

    def add(self, weights: Sequence[Tensor]) -> None:
        pass

    def evaluate(self, raw: Weights, loss_of: LossOf, progress: float) -> Evaluated:
        return Evaluated(loss_of(raw), raw, 1)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class TriggeredAveraging:
    """Raw weights until a trigger fires at an evaluation; from the next step on, the uniform average
    of every later iterate is evaluated instead.

    `trigger(history, progress)` sees the raw validation losses of earlier evaluations, the current
    one last.
    """

    def __init__(self, like: Sequence[Tensor], trigger: Callable[[list[float], float], bool]) -> None:
        self.average = RunningAverage(like)
        self.trigger = trigger
        self.triggered = False
        self.history: list[float] = []

    def add(self, weights: Sequence[Tensor]) -> None:
        if self.triggered:
            self.average.add(weights)

    def evaluate(self, raw: Weights, loss_of: LossOf, progress: float) -> Evaluated:
        if self.triggered:
            return Evaluated(loss_of(self.average.mean), self.average.mean, self.average.count)
        loss = loss_of(raw)
        self.history.append(loss)
        self.triggered = self.trigger(self.history, progress)
        return Evaluated(loss, raw, 1)

    def state_dict(self) -> dict[str, Any]:
        return {"triggered": self.triggered, "history": list(self.history), "average": self.average.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.triggered, self.history = state["triggered"], list(state["history"])
        self.average.load_state_dict(state["average"])


def tail_trigger(patience: int, latest_start: float) -> Callable[[list[float], float], bool]:
    """`patience` evaluations without improving on the best before them, or `latest_start` of the budget used."""

    def trigger(history: list[float], progress: float) -> bool:
        best_at = min(range(len(history)), key=history.__getitem__)
        return len(history) - 1 - best_at >= patience or progress >= latest_start

    return trigger


def non_monotone_trigger(interval: int) -> Callable[[list[float], float], bool]:
    """NT-ASGD: the loss is worse than the best of all but the last `interval` earlier evaluations.

    As in the AWD-LSTM code: `len(logs) > n and val_loss > min(logs[:-n])`, before appending val_loss.
    """

    def trigger(history: list[float], progress: float) -> bool:
        *earlier, current = history
        return len(earlier) > interval and current > min(earlier[:-interval])

    return trigger


class _Tail:
    """One running average of Two-Tailed Averaging, with the record that decides if it is stagnating."""

    def __init__(self, like: Sequence[Tensor]) -> None:
        self.average = RunningAverage(like)
        self.best = math.inf
        self.evaluations_since_best = 0

    def record(self, loss: float) -> None:
        if loss < self.best:
            self.best, self.evaluations_since_best = loss, 0
        else:
            self.evaluations_since_best += 1

    def stagnating(self, patience: int) -> bool:
        return self.evaluations_since_best >= patience

    def reset(self) -> None:
        self.average.reset()
        self.best, self.evaluations_since_best = math.inf, 0

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average.state_dict(), "best": self.best,
                "evaluations_since_best": self.evaluations_since_best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average.load_state_dict(state["average"])
        self.best, self.evaluations_since_best = state["best"], state["evaluations_since_best"]


class TwoTailedAveraging:
    """Two-Tailed Averaging with the extensions of Algorithm 2 (Melis, thesis ch. 3).

    A short (S) and a long (L) running average take in every iterate. At each evaluation, if the
    short is not worse than the long, or the long is stagnating, they switch: the long average
    continues from the short one and a new short one starts. Otherwise a stagnating short average is
    restarted. If the raw weights are at least as good as the long average (L > 1) they are reported
    instead, and if the long average spans only the last evaluation period both averages restart.

    An average is stagnating when its loss has not improved for `patience` evaluations (the thesis
    says "a few"). When S = L the two averages hold the same iterates and are scored once.
    """

    def __init__(self, like: Sequence[Tensor], patience: int) -> None:
        self.short, self.long = _Tail(like), _Tail(like)
        self.patience = patience
        self.steps_since_evaluation = 0

    def add(self, weights: Sequence[Tensor]) -> None:
        self.short.average.add(weights)
        self.long.average.add(weights)
        self.steps_since_evaluation += 1

    def evaluate(self, raw: Weights, loss_of: LossOf, progress: float) -> Evaluated:
        period, self.steps_since_evaluation = self.steps_since_evaluation, 0
        short, long = self.short, self.long
        short_loss = loss_of(short.average.mean)
        long_loss = short_loss if long.average.count == short.average.count else loss_of(long.average.mean)
        short.record(short_loss)
        long.record(long_loss)
        if short_loss <= long_loss or long.stagnating(self.patience):
            long_loss = short_loss
            self.long, self.short = short, long  # switch: the long one continues from the short one ...
            self.short.reset()  # ... and the emptied old long one becomes the new short one
        elif short.stagnating(self.patience):
            short.reset()
        long = self.long
        if long.average.count > 1:
            raw_loss = loss_of(raw)
            if raw_loss <= long_loss:
                if long.average.count == period:  # the raw weights have won since the averages started
                    self.short.reset()
                    self.long.reset()
                return Evaluated(raw_loss, raw, 1)
        return Evaluated(long_loss, long.average.mean, long.average.count)

    def state_dict(self) -> dict[str, Any]:
        return {"short": self.short.state_dict(), "long": self.long.state_dict(),
                "steps_since_evaluation": self.steps_since_evaluation}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.short.load_state_dict(state["short"])
        self.long.load_state_dict(state["long"])
        self.steps_since_evaluation = state["steps_since_evaluation"]


class NoAveragingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["none"] = "none"


class TailAveragingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tail"] = "tail"
    patience: int = Field(5, ge=1, description="turns without improvement that start the average")
    latest_start: float = Field(0.8, gt=0, le=1, description="fraction of the budget after which it starts anyway")


class NTASGDConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["nt-asgd"] = "nt-asgd"
    interval: int = Field(5, ge=1, description="non-monotone interval n (evaluations)")


class TwoTailedAveragingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["2ta"] = "2ta"
    patience: int = Field(3, ge=1, description="evaluations without improvement that make an average stagnating")


AveragingConfig = Annotated[
    NoAveragingConfig | TailAveragingConfig | NTASGDConfig | TwoTailedAveragingConfig, Field(discriminator="kind")
]


def make_averaging(config: AveragingConfig, like: Sequence[Tensor]) -> Averaging:
    if isinstance(config, TailAveragingConfig):
        return TriggeredAveraging(like, tail_trigger(config.patience, config.latest_start))
    if isinstance(config, NTASGDConfig):
        return TriggeredAveraging(like, non_monotone_trigger(config.interval))
    if isinstance(config, TwoTailedAveragingConfig):
        return TwoTailedAveraging(like, config.patience)
    return NoAveraging()
