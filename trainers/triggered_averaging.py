"""Triggered averaging: the raw weights until a trigger fires, then the uniform average of every later
iterate. Two triggers: triggered tail averaging (Melis et al. 2020) after `patience` turns without
improvement or once `latest_start` of the budget is used, and NT-ASGD's non-monotone trigger
(Merity et al. 2017).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from lm_tuner.trainers.averaging_protocol import Evaluated, LossOf, RunningAverage, Weights


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
