"""Recurrent cells (LSTM, RLSTM, mLSTM) and the Mogrifier, each defined once.

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

import math

import torch
from torch import Tensor, nn

from lm_tuner.models import cpu_kernels
from lm_tuner.models.tape import Linear, Tape
from lm_tuner.models.triton_support import triton_serves

Cache = tuple[Tensor | None, ...]
"""What a step keeps for its backward pass."""


def truncated_normal_(tensor: Tensor, std: float) -> Tensor:
    return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2 * std, b=2 * std)


def init_forget_bias_(bias: Tensor, chrono_t_max: float) -> None:
    """Mean 1 with std sqrt(1/n), or chrono init ln U(1, T_max - 1) when `chrono_t_max` > 0."""
    with torch.no_grad():
        if chrono_t_max > 0:
            bias.uniform_(1.0, chrono_t_max - 1.0).log_()
        else:
            truncated_normal_(bias, math.sqrt(1.0 / bias.numel())).add_(1.0)


def tanh(x: Tensor) -> Tensor:
    """tanh(x) as 2 sigmoid(2x) - 1: the same function, and two to three times faster than torch.tanh on CPU."""
    return 2.0 * torch.sigmoid(2.0 * x) - 1.0


def _route_capped_gradient(i: Tensor, i_used: Tensor, d_i: Tensor, d_f: Tensor) -> None:
    """min(i, 1 - f) passes its gradient (in `d_i`) to i where i is the smaller one, else to f (negated)."""
    moved = d_i * (i_used < i).to(d_i.dtype)
    d_i.sub_(moved)
    d_f.sub_(moved)


def lstm_update(x_term: Tensor, h_term: Tensor, c_prev: Tensor, cap_input_gate: bool
                ) -> tuple[Tensor, Tensor, Cache]:
    """h, c from pre-activations x_term + h_term ordered (i, f, o, j); with the cap the input gate is min(i, 1 - f).

    Outside autograd, float32 GPU tensors take one Triton kernel (models/lstm_kernels.py) instead, and
    CPU tensors the C++ kernel (models/cpu_kernels.py) where it could be built.
    """
    if not _under_autograd(x_term, h_term, c_prev):
        if triton_serves(x_term, h_term, c_prev):
            from lm_tuner.models import lstm_kernels

            return lstm_kernels.lstm_update(x_term, h_term, c_prev, cap_input_gate)
        if (kernels := cpu_kernels.serving(x_term, h_term, c_prev)) is not None:
            h, c, sigmoids, j, i_used, tanh_c = kernels.lstm_update(x_term, h_term, c_prev, cap_input_gate)
            return h, c, (sigmoids, j, i_used, c_prev, tanh_c)
    gates = x_term + h_term
    hidden = c_prev.shape[1]
    sigmoids = torch.sigmoid(gates[:, : 3 * hidden])
    i, f, o = sigmoids.chunk(3, dim=1)
    j = tanh(gates[:, 3 * hidden :])
    i_used = torch.minimum(i, 1.0 - f) if cap_input_gate else i
    c = torch.addcmul(f * c_prev, i_used, j)
    tanh_c = tanh(c)
    return o * tanh_c, c, (sigmoids, j, i_used, c_prev, tanh_c)


def _under_autograd(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def lstm_update_backward(cache: Cache, dh: Tensor, dc: Tensor, cap_input_gate: bool) -> tuple[Tensor, Tensor]:
    """Gradients of the gate pre-activations and of c_prev, given those of h and c."""
    if triton_serves(dh, dc):
        from lm_tuner.models import lstm_kernels

        return lstm_kernels.lstm_update_backward(cache, dh, dc, cap_input_gate)
    if (kernels := cpu_kernels.serving(dh, dc)) is not None:
        return tuple(kernels.lstm_update_backward(*cache, dh, dc, cap_input_gate))
    sigmoids, j, i_used, c_prev, tanh_c = cache
    i, f, o = sigmoids.chunk(3, dim=1)
    dc = torch.addcmul(dc, dh * o, 1.0 - tanh_c * tanh_c)
    d_gates = dh.new_empty(dh.shape[0], 4 * dh.shape[1])
    d_i, d_f, d_o, d_j = d_gates.chunk(4, dim=1)
    torch.mul(dc, j, out=d_i)
    torch.mul(dc, c_prev, out=d_f)
    torch.mul(dh, tanh_c, out=d_o)
    if cap_input_gate:
        _route_capped_gradient(i, i_used, d_i, d_f)
    d_gates[:, : 3 * dh.shape[1]].mul_(sigmoids * (1.0 - sigmoids))
    torch.mul(dc * i_used, 1.0 - j * j, out=d_j)
    return d_gates, dc * f


class LSTMCell(nn.Module):
    """The LSTM: gates i, f, o, j from x and h_prev, each side through one matrix tiling all four gates."""

    def __init__(self, input_size: int, hidden_size: int, *, cap_input_gate: bool = True,
                 chrono_t_max: float = 0.0) -> None:
        super().__init__()
        self.hidden_size, self.cap_input_gate = hidden_size, cap_input_gate
        self.input = nn.Linear(input_size, 4 * hidden_size)
        self.recurrent = nn.Linear(hidden_size, 4 * hidden_size, bias=False)
        std = math.sqrt(1.0 / (input_size + hidden_size))  # each gate sees [x, h]
        truncated_normal_(self.input.weight, std)
        truncated_normal_(self.recurrent.weight, std)
        truncated_normal_(self.input.bias, math.sqrt(1.0 / hidden_size))
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
        bias_std = math.sqrt(1.0 / hidden)
        std_ij, std_f = math.sqrt(1.0 / (input_size + hidden)), math.sqrt(1.0 / (2 * hidden))
        truncated_normal_(self.input.weight, std_ij)
        truncated_normal_(self.input.bias, bias_std)
        with torch.no_grad():
            truncated_normal_(self.recurrent.weight[: 2 * hidden], std_ij)
            truncated_normal_(self.recurrent.weight[2 * hidden :], std_f)
        truncated_normal_(self.forget.weight, std_f)
        init_forget_bias_(self.forget.bias, chrono_t_max)
        truncated_normal_(self.output.weight, math.sqrt(1.0 / hidden))
        truncated_normal_(self.output.bias, bias_std)

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
            _route_capped_gradient(i, i_used, d_i, d_f)
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
        gate_std = math.sqrt(1.0 / (input_size + hidden))  # each gate sees [x, m]
        with torch.no_grad():
            truncated_normal_(self.input.weight[: 4 * hidden], gate_std)
            truncated_normal_(self.input.weight[4 * hidden :], math.sqrt(1.0 / input_size))
        truncated_normal_(self.hidden_factor.weight, math.sqrt(1.0 / hidden))
        truncated_normal_(self.recurrent.weight, gate_std)
        truncated_normal_(self.recurrent.bias, math.sqrt(1.0 / hidden))
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


CELLS: dict[str, type[LSTMCell] | type[RLSTMCell] | type[MLSTMCell]] = {
    "lstm": LSTMCell,
    "rlstm": RLSTMCell,
    "mlstm": MLSTMCell,
}


class GateProjection(nn.Module):
    """The affine map of one mogrifier round: full rank, or two factors of rank k (Q = Q_left Q_right)."""

    def __init__(self, source: int, target: int, rank: int) -> None:
        super().__init__()
        if rank <= 0:
            self.maps = nn.ModuleList([nn.Linear(source, target)])
            truncated_normal_(self.maps[0].weight, math.sqrt(1.0 / source))
        else:
            self.maps = nn.ModuleList([nn.Linear(source, rank, bias=False), nn.Linear(rank, target)])
            factor_std = (1.0 / (source * rank)) ** 0.25
            truncated_normal_(self.maps[0].weight, factor_std)
            truncated_normal_(self.maps[1].weight, factor_std)
        truncated_normal_(self.maps[-1].bias, math.sqrt(1.0 / target))

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
