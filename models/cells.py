"""Recurrent cells: the capped-input-gate LSTM and the Mogrifier pre-processing.

Shapes follow the time-major convention: a window is (time, batch, features).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

State = tuple[Tensor, Tensor]
"""(h, c) of one layer, each (batch, hidden)."""


def truncated_normal_(tensor: Tensor, std: float) -> Tensor:
    return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2 * std, b=2 * std)


def lstm_update(gates: Tensor, c_prev: Tensor, cap_input_gate: bool) -> State:
    """One LSTM state update from pre-activations ordered (i, j, f, o).

    With the cap, the input gate is min(i, 1 - f), which keeps |c| <= 1.
    """
    i, j, f, o = gates.chunk(4, dim=1)
    i, f, o, j = torch.sigmoid(i), torch.sigmoid(f), torch.sigmoid(o), torch.tanh(j)
    if cap_input_gate:
        i = torch.minimum(i, 1.0 - f)
    c = f * c_prev + i * j
    return o * torch.tanh(c), c


class GateProjection(nn.Module):
    """An affine map used by one mogrifier round, full rank or a product of two rank-k factors."""

    def __init__(self, source: int, target: int, rank: int) -> None:
        super().__init__()
        self.rank = rank
        if rank <= 0:
            self.weight = nn.Parameter(torch.empty(target, source))
            truncated_normal_(self.weight, math.sqrt(1.0 / source))
        else:
            factor_std = (1.0 / (source * rank)) ** 0.25
            self.left = nn.Parameter(truncated_normal_(torch.empty(target, rank), factor_std))
            self.right = nn.Parameter(truncated_normal_(torch.empty(rank, source), factor_std))
        self.bias = nn.Parameter(truncated_normal_(torch.empty(target), math.sqrt(1.0 / target)))

    def forward(self, inputs: Tensor) -> Tensor:
        if self.rank <= 0:
            return nn.functional.linear(inputs, self.weight, self.bias)
        return nn.functional.linear(nn.functional.linear(inputs, self.right), self.left, self.bias)


class Mogrifier(nn.Module):
    """Mutual gating of the input and the previous state before the cell (Melis et al., 2020).

    Odd rounds (1-based) gate x from h, even rounds gate h from the updated x; the factor 2 keeps a
    random initialisation close to the identity.
    """

    def __init__(self, input_size: int, hidden_size: int, rounds: int, rank: int) -> None:
        super().__init__()
        self.projections = nn.ModuleList(
            GateProjection(hidden_size, input_size, rank) if k % 2 == 0
            else GateProjection(input_size, hidden_size, rank)
            for k in range(rounds)
        )

    def forward(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        for k, projection in enumerate(self.projections):
            if k % 2 == 0:
                x = 2.0 * torch.sigmoid(projection(h)) * x
            else:
                h = 2.0 * torch.sigmoid(projection(x)) * h
        return x, h


class LSTMLayer(nn.Module):
    """One LSTM layer over a window, optionally with a mogrifier and variational state dropout.

    The state-dropout mask is drawn once per sequence per call (one call = one BPTT window) and
    multiplies h_prev inside the step; the carried state is never masked.
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        cap_input_gate: bool = True,
        mogrifier_rounds: int = 0,
        mogrifier_rank: int = 0,
    ) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        self.cap_input_gate = cap_input_gate
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias = nn.Parameter(torch.empty(4 * hidden_size))
        self.mogrifier = (
            Mogrifier(input_size, hidden_size, mogrifier_rounds, mogrifier_rank) if mogrifier_rounds > 0 else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = math.sqrt(1.0 / (self.input_size + self.hidden_size))
        truncated_normal_(self.weight_ih, std)
        truncated_normal_(self.weight_hh, std)
        with torch.no_grad():
            truncated_normal_(self.bias, math.sqrt(1.0 / self.hidden_size))
            self.bias[2 * self.hidden_size : 3 * self.hidden_size] += 1.0  # forget gate mean 1

    def forward(self, inputs: Tensor, state: State, state_dropout: float = 0.0) -> tuple[Tensor, State]:
        h, c = state
        mask = None
        if self.training and state_dropout > 0:
            keep = 1.0 - state_dropout
            mask = torch.bernoulli(torch.full_like(h, keep)) / keep
        input_gates = None
        if self.mogrifier is None:  # x does not depend on h: project the whole window at once
            input_gates = nn.functional.linear(inputs, self.weight_ih, self.bias)
        outputs = []
        for t in range(inputs.shape[0]):
            h_in = h if mask is None else h * mask
            if input_gates is None:
                x, h_in = self.mogrifier(inputs[t], h_in)
                gates = nn.functional.linear(x, self.weight_ih, self.bias)
            else:
                gates = input_gates[t]
            gates = gates + nn.functional.linear(h_in, self.weight_hh)
            h, c = lstm_update(gates, c, self.cap_input_gate)
            outputs.append(h)
        return torch.stack(outputs), (h, c)
