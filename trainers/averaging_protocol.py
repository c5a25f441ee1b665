"""What every weight-averaging strategy is: the `Averaging` protocol a training run drives, the
`Evaluated` weights it reports at each evaluation, and the uniform `RunningAverage` of iterates the
strategies build on.

Every strategy sees each new iterate through `add` and, at each evaluation, calls `loss_of` on the
weights it wants scored, then returns the weights to report (and to checkpoint if they are best): always
one of the weight lists it passed to `loss_of`, so the run can tell which softmax temperature they were
scored at.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

Weights = list[Tensor]
LossOf = Callable[[Weights], float]


@dataclass(frozen=True)
class Evaluated:
    """The weights a strategy reports at an evaluation, their loss, how many iterates they average
    (1: the raw weights), and the softmax temperature (logit scale) the loss is at, which the training
    run chose for these weights (strategies leave it at 1). The weights may be the strategy's own running
    buffers: use them before the next `add`."""

    loss: float
    weights: Weights
    length: int
    logit_scale: float = 1.0


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

