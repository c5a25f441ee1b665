"""Truncated-BPTT batching: parallel streams cut into windows, state carried across windows."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

# Variable-length BPTT as in AWD-LSTM (Merity et al. 2017, section 4.1): the base length is bptt with
# probability 0.95, else bptt / 2; the window length is drawn from N(base, 5), and is at least 5.
FULL_WINDOW_PROBABILITY = 0.95
WINDOW_LENGTH_STD = 5.0
MIN_WINDOW_LENGTH = 5


def batchify(stream: Tensor, batch_size: int) -> Tensor:
    """Split a 1-D token stream into `batch_size` parallel streams: (steps, batch).

    The tail that does not fill a whole column is dropped.
    """
    steps = stream.numel() // batch_size
    if steps < 2:
        raise ValueError(
            f"batch_size: {batch_size} parallel streams leave fewer than 2 tokens each "
            f"in a split of {stream.numel()} tokens; use a smaller batch_size"
        )
    return stream[: steps * batch_size].view(batch_size, steps).t().contiguous()


def windows(batched: Tensor, bptt: int, start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
    """(inputs, targets) windows of at most `bptt` steps, in order, from row `start`."""
    last = batched.shape[0] - 1
    for begin in range(start, last, bptt):
        end = min(begin + bptt, last)
        yield batched[begin:end], batched[begin + 1 : end + 1]


class TrainingStream:
    """Training windows in order, pass after pass, from a position that can be saved and restored.

    `next_window` also says whether the window starts a new pass, where the carried state is reset.
    With `variable_length`, window lengths are drawn from `generator` (AWD-LSTM's scheme).
    """

    def __init__(self, batched: Tensor, bptt: int, *, variable_length: bool = False,
                 generator: torch.Generator | None = None) -> None:
        self.batched = batched
        self.bptt = bptt
        self.variable_length = variable_length
        self.generator = generator or torch.Generator()
        self.position = 0  # row where the next window starts
        self.passes = 0  # completed passes over the data

    @property
    def rows(self) -> int:
        """Rows that can start a window (the last row is only ever a target)."""
        return self.batched.shape[0] - 1

    @property
    def epochs(self) -> float:
        """Passes over the training data so far, fractional."""
        return self.passes + self.position / self.rows

    def next_window(self) -> tuple[Tensor, Tensor, bool]:
        starts_pass = self.position == 0
        begin = self.position
        end = min(begin + self._window_length(), self.rows)
        self.position = end
        if end == self.rows:
            self.position, self.passes = 0, self.passes + 1
        return self.batched[begin:end], self.batched[begin + 1 : end + 1], starts_pass

    def _window_length(self) -> int:
        if not self.variable_length:
            return self.bptt
        full = torch.rand((), generator=self.generator).item() < FULL_WINDOW_PROBABILITY
        base = self.bptt if full else self.bptt / 2
        drawn = base + WINDOW_LENGTH_STD * torch.randn((), generator=self.generator).item()
        return max(MIN_WINDOW_LENGTH, math.floor(drawn))

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "passes": self.passes, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position, self.passes = state["position"], state["passes"]
        self.generator.set_state(state["generator"])
