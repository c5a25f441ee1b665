"""An RLSTM layer's window in two C++ calls, forward and backward (models/csrc/cpu_kernels.cpp).

As models/lstm_window.py does for the LSTM, on the CPU: plain, the input side of every step is one matrix
multiply over the window before the loop (its gradient one after); behind a low-rank mogrifier that the C++
kernel runs (models/mogrifier_window.py, CpuKernelWindow) it is a product per step. Per step the recurrent
(i, j, f), forget (reads i * j) and output (reads c times the state mask) products take the same weights,
packed for oneDNN or not (lstm_window.window_weights), and the element-wise math is RLSTMCell.step's and
step_backward's (models/cells.py), so values and gradients are those of the Python loop.
The tape records what the four weights' gradients need, as for any window.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from torch import Tensor

from lm_tuner.models.cells import RLSTMCell
from lm_tuner.models.lstm_window import window_weights
from lm_tuner.models.mogrifier_window import CpuKernelWindow
from lm_tuner.models.tape import Tape


@dataclass
class WindowCache:
    """What the backward loop reads: the mogrifier's window, c before each step (and after the last), and each
    step's i, j, f, input gate used, o and tanh(c) (B, 6H)."""

    mogrify: CpuKernelWindow | None
    cells: Tensor
    saved: Tensor


def forward(kernels: ModuleType, tape: Tape, cell: RLSTMCell, mogrify: CpuKernelWindow | None, inputs: Tensor,
            h: Tensor, c: Tensor, state_mask: Tensor | None) -> tuple[Tensor, tuple[Tensor, Tensor], WindowCache]:
    """Outputs (time, batch, hidden), the last (h, c), and the cache for `backward`."""
    steps, h, c = inputs.shape[0], h.detach(), c.detach()
    modules = [cell.recurrent, cell.forget, cell.output]
    biases = [tape.weights(cell.forget)[1], tape.weights(cell.output)[1]]
    if mogrify is None:
        weights, onednn = window_weights(tape, modules, h, steps)
        x_part = tape(cell.input, inputs)
        outputs, cells, forget_inputs, output_inputs, saved, h_seen = kernels.rlstm_window_forward(
            x_part, h, c, weights, biases, onednn, state_mask, cell.cap_input_gate)
    else:
        (input_weight, *weights), onednn = window_weights(tape, [cell.input, *modules], h, steps)
        x_values, h_seen = mogrify.values[mogrify.last_x], mogrify.values[mogrify.last_h]
        tape.add_inputs(cell.input, x_values)
        outputs, cells, forget_inputs, output_inputs, saved = kernels.mogrifier_rlstm_window_forward(
            mogrify.kernel, x_values, h_seen, h, c, input_weight, tape.weights(cell.input)[1], weights, biases,
            onednn, mogrify.state_mask, cell.cap_input_gate)
    for module, seen in zip(modules, (h_seen, forget_inputs, output_inputs), strict=True):
        tape.add_inputs(module, seen)
    return outputs, (outputs[-1].clone(), cells[-1].clone()), WindowCache(mogrify, cells, saved)


def backward(kernels: ModuleType, tape: Tape, cell: RLSTMCell, cache: WindowCache, d_outputs: Tensor, dh: Tensor,
             dc: Tensor, state_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of (inputs, h0, c0) given those of the outputs and of the last state."""
    steps, d_outputs, dh, dc = d_outputs.shape[0], d_outputs.contiguous(), dh.contiguous(), dc.contiguous()
    modules, hidden = [cell.recurrent, cell.forget, cell.output], cell.hidden_size
    if cache.mogrify is None:
        weights, onednn = window_weights(tape, modules, dh, steps, transposed=True)
        d_pre, d_output_gate, dh, dc = kernels.rlstm_window_backward(
            d_outputs, dh, dc, cache.cells, cache.saved, weights, onednn, state_mask, cell.cap_input_gate)
        d_x_part = d_pre[..., : 2 * hidden].contiguous()  # copied once: its weight's gradient reads it too
        d_inputs = tape.backward(cell.input, d_x_part)
    else:
        (input_weight, *weights), onednn = window_weights(tape, [cell.input, *modules], dh, steps, transposed=True)
        d_pre, d_output_gate, d_inputs, dh, dc = kernels.mogrifier_rlstm_window_backward(
            cache.mogrify.kernel, d_outputs, dh, dc, cache.cells, cache.saved, input_weight, weights, onednn,
            cache.mogrify.state_mask, cell.cap_input_gate)
        tape.add_grads(cell.input, d_pre[..., : 2 * hidden])
        cache.mogrify.finish_backward(tape)
    for module, grads in zip(modules, (d_pre, d_pre[..., 2 * hidden :], d_output_gate), strict=True):
        tape.add_grads(module, grads)
    return d_inputs, dh, dc
