"""An LSTM or mLSTM layer's window in two C++ calls, forward and backward (models/csrc/cpu_kernels.cpp); the
RLSTM's is models/rlstm_window.py.

The fast path otherwise runs the loop over time in Python, a dozen operations per step each way. For an
mLSTM, or an LSTM plain or behind a low-rank mogrifier that the C++ kernel runs (models/mogrifier_window.py,
CpuKernelWindow), on the CPU, the loop runs in C++ instead: the same products (oneDNN with the weights packed once
per window, as models/tape.py applies them), the same mogrifier rounds and the same element-wise update
(models.lstm_update), so values and gradients are those of the Python loop (models/cells.py states the
math). Without a mogrifier the input side of every step is one matrix multiply over the window before the
loop, and its gradient one after.
The tape records what the weight gradients need, as for any window.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from torch import Tensor, nn

from lm_tuner.models import cpu_kernels
from lm_tuner.models.cells import LSTMCell, MLSTMCell, RLSTMCell
from lm_tuner.models.mogrifier_window import CpuKernelWindow, MogrifierWindow
from lm_tuner.models.tape import Linear, Tape
from lm_tuner.models.triton_support import triton_serves


@dataclass
class WindowCache:
    """What the backward loop reads: the mogrifier's window, the mLSTM's input side and W_mh h, c before each step
    (and after the last), and the update's caches."""

    mogrify: CpuKernelWindow | None
    factors: tuple[Tensor, Tensor] | None
    cells: Tensor
    sigmoids: Tensor
    j: Tensor
    i_used: Tensor
    tanh_c: Tensor


def window_kernels(cell: object, mogrify: MogrifierWindow | None, linear: Linear, inputs: Tensor
                   ) -> ModuleType | None:
    """The compiled kernels where they take this layer's window (this module's for an LSTM or mLSTM,
    models/rlstm_window.py's for an RLSTM), else None."""
    if not isinstance(cell, LSTMCell | MLSTMCell | RLSTMCell) or not isinstance(linear, Tape) or triton_serves(inputs):
        return None  # where Triton serves (a GPU, or its interpreter on a CPU) the LSTM update is its kernel
    if mogrify is not None and not (isinstance(mogrify, CpuKernelWindow) and isinstance(cell, LSTMCell | RLSTMCell)):
        return None
    return cpu_kernels.serving(inputs)


def window_weights(tape: Tape, modules: list[nn.Linear], rows: Tensor, steps: int, transposed: bool = False
                   ) -> tuple[list[Tensor], bool]:
    """The weights the C++ loop multiplies by, and whether they are packed for oneDNN: all of them (transposed
    for the backward loop) where oneDNN takes them all and the window has several steps (packing costs more
    than it saves for one), else the plain (out, in) weights for at::mm."""
    packed = [tape.packed_weight(module, rows, transposed) for module in modules] if steps > 1 else [None]
    if any(weight is None for weight in packed):
        return [tape.weights(module)[0] for module in modules], False
    return packed, True


def forward(kernels: ModuleType, tape: Tape, cell: LSTMCell | MLSTMCell, mogrify: CpuKernelWindow | None,
            inputs: Tensor, h: Tensor, c: Tensor, state_mask: Tensor | None
            ) -> tuple[Tensor, tuple[Tensor, Tensor], WindowCache]:
    """Outputs (time, batch, hidden), the last (h, c), and the cache for `backward`."""
    steps, h, c, factors = inputs.shape[0], h.detach(), c.detach(), None
    if isinstance(cell, MLSTMCell):
        (hidden_factor, recurrent), onednn = window_weights(tape, [cell.hidden_factor, cell.recurrent], h, steps)
        x_part = tape(cell.input, inputs)
        outputs, h_seen, m, factor_h, *cache = kernels.mlstm_window_forward(
            x_part, h, c, hidden_factor, recurrent, tape.weights(cell.recurrent)[1], onednn, state_mask,
            cell.cap_input_gate)
        tape.add_inputs(cell.hidden_factor, h_seen)
        h_seen, factors = m, (x_part, factor_h)  # the recurrent weight reads m
    elif mogrify is None:
        (recurrent,), onednn = window_weights(tape, [cell.recurrent], h, steps)
        x_part = tape(cell.input, inputs)
        outputs, h_seen, *cache = kernels.lstm_window_forward(x_part, h, c, recurrent, onednn, state_mask,
                                                              cell.cap_input_gate)
    else:
        (input_weight, recurrent), onednn = window_weights(tape, [cell.input, cell.recurrent], h, steps)
        x_values, h_seen = mogrify.values[mogrify.last_x], mogrify.values[mogrify.last_h]
        tape.add_inputs(cell.input, x_values)
        outputs, *cache = kernels.mogrifier_lstm_window_forward(
            mogrify.kernel, x_values, h_seen, h, c, input_weight, tape.weights(cell.input)[1], recurrent, onednn,
            mogrify.state_mask, cell.cap_input_gate)
    tape.add_inputs(cell.recurrent, h_seen)
    cells = cache[0]
    return outputs, (outputs[-1].clone(), cells[-1].clone()), WindowCache(mogrify, factors, *cache)


def backward(kernels: ModuleType, tape: Tape, cell: LSTMCell | MLSTMCell, cache: WindowCache, d_outputs: Tensor,
             dh: Tensor, dc: Tensor, state_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of (inputs, h0, c0) given those of the outputs and of the last state."""
    steps, d_outputs, dh, dc = d_outputs.shape[0], d_outputs.contiguous(), dh.contiguous(), dc.contiguous()
    update = (cache.cells, cache.sigmoids, cache.j, cache.i_used, cache.tanh_c)
    if cache.factors is not None:
        modules = [cell.hidden_factor, cell.recurrent]
        (hidden_factor, recurrent), onednn = window_weights(tape, modules, dh, steps, transposed=True)
        d_x_part, d_gates, d_factor_h, dh, dc = kernels.mlstm_window_backward(
            d_outputs, dh, dc, *cache.factors, *update, hidden_factor, recurrent, onednn, state_mask,
            cell.cap_input_gate)
        tape.add_grads(cell.hidden_factor, d_factor_h)
        d_inputs = tape.backward(cell.input, d_x_part)
    elif cache.mogrify is None:
        (recurrent,), onednn = window_weights(tape, [cell.recurrent], dh, steps, transposed=True)
        d_gates, dh, dc = kernels.lstm_window_backward(d_outputs, dh, dc, *update, recurrent, onednn, state_mask,
                                                       cell.cap_input_gate)
        d_inputs = tape.backward(cell.input, d_gates)
    else:
        modules = [cell.input, cell.recurrent]
        (input_weight, recurrent), onednn = window_weights(tape, modules, dh, steps, transposed=True)
        d_gates, d_inputs, dh, dc = kernels.mogrifier_lstm_window_backward(
            cache.mogrify.kernel, d_outputs, dh, dc, *update, input_weight, recurrent, onednn,
            cache.mogrify.state_mask, cell.cap_input_gate)
        tape.add_grads(cell.input, d_gates)
        cache.mogrify.finish_backward(tape)
    tape.add_grads(cell.recurrent, d_gates)
    return d_inputs, dh, dc
