"""The Mogrifier (Melis et al., "Mogrifier LSTM", 2020): rounds of mutual gating of x and h before the cell.

Like the cells it is written once, against the `linear` argument (see models/tape.py), with its hand-derived
gradient beside the forward math. A layer runs it step by step through models/mogrifier_window.py.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lm_tuner.models.initialisation import init_tile_, truncated_normal_
from lm_tuner.models.tape import Cache, Linear, Tape


class GateProjection(nn.Module):
    """The affine map of one mogrifier round: full rank, or two factors of rank k (Q = Q_left Q_right)."""

    def __init__(self, source: int, target: int, rank: int) -> None:
        super().__init__()
        if rank <= 0:
            self.maps = nn.ModuleList([nn.Linear(source, target)])
            init_tile_(self.maps[0].weight, source)  # the cell initialiser, as in the reference
        else:
            self.maps = nn.ModuleList([nn.Linear(source, rank, bias=False), nn.Linear(rank, target)])
            # As the reference (lamb utils.make_low_rank_factorization_initializer): an entry of the product sums
            # `rank` products of two factor entries, so it would have the full-rank variance 1 / source, were the
            # factors not truncated without correction, as they are there (the product's std is 0.77 sqrt(1 / source)).
            factor_std = (1.0 / (source * rank)) ** 0.25
            truncated_normal_(self.maps[0].weight, factor_std)
            truncated_normal_(self.maps[1].weight, factor_std)
        nn.init.zeros_(self.maps[-1].bias)  # 2 sigma(0) = 1: a round starts close to the identity

    def forward(self, linear: Linear, inputs: Tensor) -> Tensor:
        for module in self.maps:
            inputs = linear(module, inputs)
        return inputs

    def backward(self, tape: Tape, grad_outputs: Tensor) -> Tensor:
        for module in reversed(self.maps):
            grad_outputs = tape.backward(module, grad_outputs)
        return grad_outputs


class Mogrifier(nn.Module):
    """Mutual gating of the input and the previous state before the cell (Melis et al., 2020).

    Odd rounds (1-based) gate x from h, even rounds gate h from the updated x: x <- 2 sigma(Q h + b) x,
    h <- 2 sigma(R x + b) h. The factor 2 keeps a random initialisation close to the identity.
    """

    def __init__(self, input_size: int, hidden_size: int, rounds: int, rank: int) -> None:
        super().__init__()
        self.projections = nn.ModuleList(
            GateProjection(hidden_size, input_size, rank) if k % 2 == 0
            else GateProjection(input_size, hidden_size, rank)
            for k in range(rounds)
        )

    def forward(self, linear: Linear, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Cache]:
        cache = []
        for k, projection in enumerate(self.projections):
            if k % 2 == 0:
                gate = 2.0 * torch.sigmoid(projection(linear, h))
                cache.append((gate, x))
                x = gate * x
            else:
                gate = 2.0 * torch.sigmoid(projection(linear, x))
                cache.append((gate, h))
                h = gate * h
        return x, h, tuple(cache)

    def backward(self, tape: Tape, cache: Cache, dx: Tensor, dh: Tensor) -> tuple[Tensor, Tensor]:
        """Gradients of the original (x, h), given those of the mogrified ones."""
        for k in reversed(range(len(self.projections))):
            gate, gated = cache[k]
            slope = torch.addcmul(gate, gate, gate, value=-0.5)  # d(2 sigma(z))/dz = 2 sigma (1 - sigma)
            if k % 2 == 0:
                d_pre = (dx * gated).mul_(slope)
                dx = dx * gate
                dh = dh + self.projections[k].backward(tape, d_pre)
            else:
                d_pre = (dh * gated).mul_(slope)
                dh = dh * gate
                dx = dx + self.projections[k].backward(tape, d_pre)
        return dx, dh
