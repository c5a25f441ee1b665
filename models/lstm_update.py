"""The LSTM's element-wise update from gate pre-activations to (h, c), and its hand-derived gradient.

The LSTM and mLSTM cells (models/cells.py) end their step with it; the RLSTM shares its pieces.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lm_tuner.models import cpu_kernels
from lm_tuner.models.tape import Cache
from lm_tuner.models.triton_support import triton_serves


def tanh(x: Tensor) -> Tensor:
    """tanh(x) as 2 sigmoid(2x) - 1: the same function, and two to three times faster than torch.tanh on CPU."""
    return 2.0 * torch.sigmoid(2.0 * x) - 1.0


def route_capped_gradient(i: Tensor, i_used: Tensor, d_i: Tensor, d_f: Tensor) -> None:
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
        route_capped_gradient(i, i_used, d_i, d_f)
    d_gates[:, : 3 * dh.shape[1]].mul_(sigmoids * (1.0 - sigmoids))
    torch.mul(dc * i_used, 1.0 - j * j, out=d_j)
    return d_gates, dc * f

