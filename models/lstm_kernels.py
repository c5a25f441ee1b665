"""Triton kernels: the LSTM's element-wise update (models.lstm_update.lstm_update) and its gradient, one launch each.

In PyTorch the update is a dozen element-wise kernels forward and fifteen backward, each reading and
writing a (batch, hidden) tensor; on a GPU the launches dominate. These compute the same formulas
(tanh as 2 sigmoid(2x) - 1, the capped input gate min(i, 1 - f)) and keep the same cache, so either
implementation's backward takes either's forward.

Gates are ordered (i, f, o, j) along the columns. The two gate terms may be column slices of wider
arrays: only their row strides are passed; columns are contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from lm_tuner.models.triton_support import on_device_of

BLOCK_ROWS, BLOCK_COLUMNS = 4, 256


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _update_forward(x_term, x_stride, h_term, h_stride, c_prev, h_out, c_out, sigmoids, j_out, i_used_out,
                    tanh_c_out, batch, H: tl.constexpr, CAP: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                    BLOCK_COLUMNS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_COLUMNS + tl.arange(0, BLOCK_COLUMNS)[None, :]
    ok = (rows < batch) & (cols < H)
    x_row, h_row = x_term + rows * x_stride + cols, h_term + rows * h_stride + cols
    i = tl.sigmoid(tl.load(x_row, mask=ok) + tl.load(h_row, mask=ok))
    f = tl.sigmoid(tl.load(x_row + H, mask=ok) + tl.load(h_row + H, mask=ok))
    o = tl.sigmoid(tl.load(x_row + 2 * H, mask=ok) + tl.load(h_row + 2 * H, mask=ok))
    j = _tanh(tl.load(x_row + 3 * H, mask=ok) + tl.load(h_row + 3 * H, mask=ok))
    if CAP:
        i_used = tl.minimum(i, 1.0 - f)
    else:
        i_used = i
    at = rows * H + cols
    c = f * tl.load(c_prev + at, mask=ok) + i_used * j
    tanh_c = _tanh(c)
    tl.store(h_out + at, o * tanh_c, mask=ok)
    tl.store(c_out + at, c, mask=ok)
    at3 = rows * (3 * H) + cols
    tl.store(sigmoids + at3, i, mask=ok)
    tl.store(sigmoids + at3 + H, f, mask=ok)
    tl.store(sigmoids + at3 + 2 * H, o, mask=ok)
    tl.store(j_out + at, j, mask=ok)
    tl.store(i_used_out + at, i_used, mask=ok)
    tl.store(tanh_c_out + at, tanh_c, mask=ok)


@triton.jit
def _update_backward(sigmoids, j_in, i_used_in, c_prev, tanh_c_in, dh, dc, d_gates, dc_prev, batch,
                     H: tl.constexpr, CAP: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLUMNS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK_COLUMNS + tl.arange(0, BLOCK_COLUMNS)[None, :]
    ok = (rows < batch) & (cols < H)
    at, at3, at4 = rows * H + cols, rows * (3 * H) + cols, rows * (4 * H) + cols
    i = tl.load(sigmoids + at3, mask=ok)
    f = tl.load(sigmoids + at3 + H, mask=ok)
    o = tl.load(sigmoids + at3 + 2 * H, mask=ok)
    j = tl.load(j_in + at, mask=ok)
    i_used = tl.load(i_used_in + at, mask=ok)
    tanh_c = tl.load(tanh_c_in + at, mask=ok)
    grad_h = tl.load(dh + at, mask=ok)
    grad_c = tl.load(dc + at, mask=ok) + grad_h * o * (1.0 - tanh_c * tanh_c)
    d_i = grad_c * j
    d_f = grad_c * tl.load(c_prev + at, mask=ok)
    if CAP:  # min(i, 1 - f) passes its gradient to i where i is the smaller one, else to f (negated)
        moved = tl.where(i_used < i, d_i, 0.0)
        d_i -= moved
        d_f -= moved
    tl.store(d_gates + at4, d_i * (i * (1.0 - i)), mask=ok)
    tl.store(d_gates + at4 + H, d_f * (f * (1.0 - f)), mask=ok)
    tl.store(d_gates + at4 + 2 * H, grad_h * tanh_c * (o * (1.0 - o)), mask=ok)
    tl.store(d_gates + at4 + 3 * H, grad_c * i_used * (1.0 - j * j), mask=ok)
    tl.store(dc_prev + at, grad_c * f, mask=ok)


def _grid(batch: int, hidden: int) -> tuple[int, int]:
    return -(-batch // BLOCK_ROWS), -(-hidden // BLOCK_COLUMNS)


def _rows(t: Tensor) -> Tensor:
    """`t` with contiguous columns (row stride free)."""
    return t if t.stride(1) == 1 else t.contiguous()


def lstm_update(x_term: Tensor, h_term: Tensor, c_prev: Tensor, cap_input_gate: bool
                ) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """models.lstm_update.lstm_update of the gate pre-activations x_term + h_term, in one launch."""
    x_term, h_term, c_prev = _rows(x_term), _rows(h_term), c_prev.contiguous()
    batch, hidden = c_prev.shape
    h, c, j, i_used, tanh_c = (torch.empty_like(c_prev) for _ in range(5))
    sigmoids = c_prev.new_empty(batch, 3 * hidden)
    with on_device_of(c_prev):
        _update_forward[_grid(batch, hidden)](x_term, x_term.stride(0), h_term, h_term.stride(0), c_prev, h, c,
                                              sigmoids, j, i_used, tanh_c, batch, H=hidden, CAP=cap_input_gate,
                                              BLOCK_ROWS=BLOCK_ROWS, BLOCK_COLUMNS=BLOCK_COLUMNS)
    return h, c, (sigmoids, j, i_used, c_prev, tanh_c)


def lstm_update_backward(cache: tuple[Tensor, ...], dh: Tensor, dc: Tensor, cap_input_gate: bool
                         ) -> tuple[Tensor, Tensor]:
    """models.lstm_update.lstm_update_backward in one launch: gradients of the gate pre-activations and c_prev."""
    sigmoids, j, i_used, c_prev, tanh_c = (t.contiguous() for t in cache)
    dh, dc = dh.contiguous(), dc.contiguous()
    batch, hidden = dh.shape
    d_gates, dc_prev = dh.new_empty(batch, 4 * hidden), torch.empty_like(dh)
    with on_device_of(dh):
        _update_backward[_grid(batch, hidden)](sigmoids, j, i_used, c_prev, tanh_c, dh, dc, d_gates, dc_prev,
                                               batch, H=hidden, CAP=cap_input_gate, BLOCK_ROWS=BLOCK_ROWS,
                                               BLOCK_COLUMNS=BLOCK_COLUMNS)
    return d_gates, dc_prev
