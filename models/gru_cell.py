"""The GRU cell (Cho et al., 2014): PyTorch's `nn.GRU` (one layer), whose weights the cell loop also reads.

Gates in nn.GRU's order and equations (r, z, n):

    r = sigma(W_ir x + b_ir + W_hr h + b_hr)      z = sigma(W_iz x + b_iz + W_hz h + b_hz)
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn))  h' = (1 - z) * n + z * h

The fused path is `nn.GRU`'s own forward (cuDNN on a GPU); `step` is the same update for one time step, which the
cell loop of models/gru.py runs where state dropout or a mogrifier changes what the gates read
(docs/methodology.md#gru-and-mogrifier-gru). The GRU's state is h alone.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lm_tuner.models.initialisation import init_forget_bias_, init_tile_


class GRUCell(nn.GRU):
    """One GRU layer. Each weight tile (one input to one gate) is drawn at std sqrt(1 / fan_in); the gate biases
    b_i* at std sqrt(1 / hidden) and b_h* at 0, so that each gate's summed bias has that std too. z keeps the previous
    state, as the LSTM's forget gate does: its bias gets the forget gate's initialisation (mean 1, or chrono init
    when `chrono_t_max` > 0, Tallec & Ollivier's rule for the gate that keeps the state). `cap_input_gate` is
    accepted as every cell's is and has no effect: the GRU's gates are coupled already ((1 - z) and z)."""

    def __init__(self, input_size: int, hidden_size: int, *, cap_input_gate: bool = True,
                 chrono_t_max: float = 0.0) -> None:
        super().__init__(input_size, hidden_size)
        hidden = hidden_size
        init_tile_(self.weight_ih_l0, input_size)
        init_tile_(self.weight_hh_l0, hidden)
        init_tile_(self.bias_ih_l0, hidden)
        init_forget_bias_(self.bias_ih_l0[hidden : 2 * hidden], chrono_t_max)
        with torch.no_grad():
            self.bias_hh_l0.zero_()

    def input_part(self, x: Tensor) -> Tensor:
        """W_i x + b_i of the three gates, for a step or a whole window."""
        return nn.functional.linear(x, self.weight_ih_l0, self.bias_ih_l0)

    def step(self, x_part: Tensor, h_seen: Tensor, h: Tensor) -> Tensor:
        """The next state: the gates read `x_part` (from `input_part`) and `h_seen` (h dropped out or mogrified);
        the update interpolates between the candidate and the state `h` itself."""
        h_part = nn.functional.linear(h_seen, self.weight_hh_l0, self.bias_hh_l0)
        x_r, x_z, x_n = x_part.chunk(3, dim=1)
        h_r, h_z, h_n = h_part.chunk(3, dim=1)
        r = torch.sigmoid(x_r + h_r)
        z = torch.sigmoid(x_z + h_z)
        n = torch.tanh(torch.addcmul(x_n, r, h_n))
        return torch.addcmul(n, z, h - n)
