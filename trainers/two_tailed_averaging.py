"""Two-Tailed Averaging (Melis 2022, thesis ch. 3, Algorithms 1 and 2): a short and a long running
average whose lengths adapt to the validation loss; no trigger at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from lm_tuner.trainers.averaging_protocol import Evaluated, LossOf, RunningAverage, Weights


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
