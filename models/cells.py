"""Recurrent cells (LSTM, RLSTM, mLSTM), each defined once; the Mogrifier in front of them is models/mogrifier.py.
The GRU (models/gru_cell.py) is listed in `CELLS` too but runs in a layer of its own (models/gru.py), and so is the
Transformer's block (models/transformer_block.py), which is no recurrent cell: models/transformer.py stacks them.

Every cell maps (x, h_prev, c_prev) to (h, c) (Melis et al., "Mogrifier LSTM", 2020, section 2). Its
`step` is the only statement of its forward math: the reference path runs it under autograd; the fast path runs it on
a `Tape` and differentiates it with `step_backward`, the hand-derived gradient written beside it.
All linear maps go through the `linear` argument (see models/tape.py). The input-dependent part of
the pre-activations, `linear(cell.input, x)`, is computed by the caller so that it can be batched
over a whole window when no mogrifier makes x depend on the state. `step` receives h already
multiplied by the state-dropout mask; it also gets the mask itself, which only the RLSTM needs again.

Shapes: x (batch, input_size); h, c (batch, hidden_size).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lm_tuner.models.gru_cell import GRUCell
from lm_tuner.models.initialisation import init_forget_bias_, init_tile_
from lm_tuner.models.lstm_update import lstm_update, lstm_update_backward, route_capped_gradient, tanh
from lm_tuner.models.tape import Cache, Linear, Tape
from lm_tuner.models.transformer_block import TransformerBlock


class LSTMCell(nn.Module):
    """The LSTM: gates i, f, o, j from x and h_prev, each side through one matrix tiling all four gates."""

    def __init__(self, input_size: int, hidden_size: int, *, cap_input_gate: bool = True,
                 chrono_t_max: float = 0.0) -> None:
        super().__init__()
        self.hidden_size, self.cap_input_gate = hidden_size, cap_input_gate
        self.input = nn.Linear(input_size, 4 * hidden_size)
        self.recurrent = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        init_tile_(self.input.weight, input_size)  # the tiles W_x of all four gates
        init_tile_(self.recurrent.weight, hidden_size)  # the tiles W_h
        init_tile_(self.input.bias, hidden_size)
        init_forget_bias_(self.input.bias[hidden_size : 2 * hidden_size], chrono_t_max)

    def step(self, linear: Linear, x_part: Tensor, h: Tensor, c: Tensor, state_mask: Tensor | None
             ) -> tuple[Tensor, Tensor, Cache]:
        return lstm_update(x_part, linear(self.recurrent, h), c, self.cap_input_gate)

    def step_backward(self, tape: Tape, cache: Cache, dh: Tensor, dc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Gradients of (x_part, h, c) of the step, given those of its (h, c)."""
        d_gates, dc = lstm_update_backward(cache, dh, dc, self.cap_input_gate)
        return d_gates, tape.backward(self.recurrent, d_gates), dc


class RLSTMCell(nn.Module):
    """The Rewired LSTM (Melis thesis, ch. 4): the forget gate reads i * j, the output gate reads c.

        i, j = sigma, tanh(W_x x + W_h h + b)      f = sigma(W_fu (i * j) + W_fh h + b_f)
        c = f * c_prev + min(i, 1 - f) * j         o = sigma(W_oc (c * M_state) + b_o)
        h = o * tanh(c)

    The state-dropout mask M_state that drops h_prev also drops c on its way to the output gate.
    """

    def __init__(self, input_size: int, hidden_size: int, *, cap_input_gate: bool = True,
                 chrono_t_max: float = 0.0) -> None:
        super().__init__()
        self.hidden_size, self.cap_input_gate = hidden_size, cap_input_gate
        hidden = hidden_size
        self.input = nn.Linear(input_size, 2 * hidden)  # i, j
        self.recurrent = nn.Linear(hidden, 3 * hidden, bias=False)  # i, j, f
        self.forget = nn.Linear(hidden, hidden)  # W_fu and b_f
        self.output = nn.Linear(hidden, hidden)  # W_oc and b_o
        init_tile_(self.input.weight, input_size)
        init_tile_(self.input.bias, hidden)
        init_tile_(self.recurrent.weight, hidden)  # W_ih, W_jh and W_fh
        init_tile_(self.forget.weight, hidden)  # W_fu reads i * j
        init_forget_bias_(self.forget.bias, chrono_t_max)
        init_tile_(self.output.weight, hidden)  # W_oc reads c
        init_tile_(self.output.bias, hidden)

    def step(self, linear: Linear, x_part: Tensor, h: Tensor, c: Tensor, state_mask: Tensor | None
             ) -> tuple[Tensor, Tensor, Cache]:
        hidden = self.hidden_size
        from_h = linear(self.recurrent, h)
        i_and_j = x_part + from_h[:, : 2 * hidden]
        i, j = torch.sigmoid(i_and_j[:, :hidden]), tanh(i_and_j[:, hidden:])
        f = torch.sigmoid(linear(self.forget, i * j) + from_h[:, 2 * hidden :])
        i_used = torch.minimum(i, 1.0 - f) if self.cap_input_gate else i
        c_prev, c = c, torch.addcmul(f * c, i_used, j)
        o = torch.sigmoid(linear(self.output, c if state_mask is None else c * state_mask))
        tanh_c = tanh(c)
        return o * tanh_c, c, (i, j, f, i_used, c_prev, o, tanh_c, state_mask)

    def step_backward(self, tape: Tape, cache: Cache, dh: Tensor, dc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Gradients of (x_part, h, c) of the step, given those of its (h, c)."""
        i, j, f, i_used, c_prev, o, tanh_c, state_mask = cache
        hidden = self.hidden_size
        d_c_seen = tape.backward(self.output, dh * tanh_c * o * (1.0 - o))
        dc = torch.addcmul(dc, dh * o, 1.0 - tanh_c * tanh_c)
        dc.add_(d_c_seen if state_mask is None else d_c_seen * state_mask)
        d_pre = dh.new_empty(dh.shape[0], 3 * hidden)  # pre-activations of i, j, f
        d_i, d_j, d_f = d_pre.chunk(3, dim=1)
        torch.mul(dc, j, out=d_i)
        torch.mul(dc, c_prev, out=d_f)
        if self.cap_input_gate:
            route_capped_gradient(i, i_used, d_i, d_f)
        d_f.mul_(f * (1.0 - f))
        d_i_times_j = tape.backward(self.forget, d_f)
        torch.addcmul(dc * i_used, d_i_times_j, i, out=d_j)
        d_j.mul_(1.0 - j * j)
        d_i.addcmul_(d_i_times_j, j).mul_(i * (1.0 - i))
        return d_pre[:, : 2 * hidden], tape.backward(self.recurrent, d_pre), dc * f


class MLSTMCell(nn.Module):
    """The multiplicative LSTM (Krause, eq. 3.5-3.9): m = (W_mx x) * (W_mh h) replaces h in every gate."""

    def __init__(self, input_size: int, hidden_size: int, *, cap_input_gate: bool = True,
                 chrono_t_max: float = 0.0) -> None:
        super().__init__()
        self.hidden_size, self.cap_input_gate = hidden_size, cap_input_gate
        hidden = hidden_size
        self.input = nn.Linear(input_size, 5 * hidden, bias=False)  # gates i, f, o, j, then W_mx
        self.hidden_factor = nn.Linear(hidden, hidden, bias=False)  # W_mh
        self.recurrent = nn.Linear(hidden, 4 * hidden)  # W_m and the gate biases
        init_tile_(self.input.weight, input_size)  # the gates' tiles W_x and W_mx
        init_tile_(self.hidden_factor.weight, hidden)
        init_tile_(self.recurrent.weight, hidden)  # the gates' tiles W_m
        init_tile_(self.recurrent.bias, hidden)
        init_forget_bias_(self.recurrent.bias[hidden : 2 * hidden], chrono_t_max)

    def step(self, linear: Linear, x_part: Tensor, h: Tensor, c: Tensor, state_mask: Tensor | None
             ) -> tuple[Tensor, Tensor, Cache]:
        hidden = self.hidden_size
        factor_x, factor_h = x_part[:, 4 * hidden :], linear(self.hidden_factor, h)
        h, c, update_cache = lstm_update(x_part[:, : 4 * hidden], linear(self.recurrent, factor_x * factor_h), c,
                                         self.cap_input_gate)
        return h, c, (factor_x, factor_h, *update_cache)

    def step_backward(self, tape: Tape, cache: Cache, dh: Tensor, dc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Gradients of (x_part, h, c) of the step, given those of its (h, c)."""
        factor_x, factor_h, *update_cache = cache
        hidden = self.hidden_size
        d_x_part = dh.new_empty(dh.shape[0], 5 * hidden)
        d_gates, dc = lstm_update_backward(tuple(update_cache), dh, dc, self.cap_input_gate)
        d_x_part[:, : 4 * hidden] = d_gates
        d_m = tape.backward(self.recurrent, d_gates)
        torch.mul(d_m, factor_h, out=d_x_part[:, 4 * hidden :])
        return d_x_part, tape.backward(self.hidden_factor, d_m * factor_x), dc


CELLS: dict[str, type[LSTMCell] | type[RLSTMCell] | type[MLSTMCell] | type[GRUCell] | type[TransformerBlock]] = {
    "lstm": LSTMCell,
    "rlstm": RLSTMCell,
    "mlstm": MLSTMCell,
    "gru": GRUCell,  # state (h,), not (h, c): it runs in models/gru.py's layer, not in models/recurrence.py's
    "transformer": TransformerBlock,  # not recurrent: a stack of them reads a whole window (models/transformer.py)
}
