"""One recurrent layer over a BPTT window, and the fast path that runs it.

The loop over time is the same for both paths (`RecurrentLayer.run`); they differ in how linear maps
are applied and differentiated. The reference path is plain autograd. The fast path, used by
default, is one autograd node per layer and window: the forward loop runs without building a graph,
and the backward loop applies each cell's hand-derived gradient, then computes every weight
gradient as a single matrix multiply over the window (see models/tape.py). All rounds of a low-rank
mogrifier step run in one call each way (models/mogrifier_window.py): a Triton kernel on a GPU, a C++
kernel on a CPU. On a GPU the LSTM update is one Triton kernel too (models/lstm_kernels.py); on a CPU
the whole window of an LSTM or an RLSTM (plain or behind that C++ mogrifier) or an mLSTM is one C++ call each
way (models/lstm_window.py, models/rlstm_window.py). Both kinds are compiled on first use and cached on disk
(models/cpu_kernels.py, Triton's own cache).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from lm_tuner.models import cpu_kernels, lstm_window, rlstm_window
from lm_tuner.models.cells import CELLS, RLSTMCell
from lm_tuner.models.config import ModelConfig
from lm_tuner.models.mogrifier import Mogrifier
from lm_tuner.models.mogrifier_window import MogrifierWindow, mogrifier_window
from lm_tuner.models.tape import Cache, Linear, Tape, autograd_linear

State = tuple[Tensor, Tensor]
"""(h, c) of one layer, each (batch, hidden)."""
WindowCache = lstm_window.WindowCache | rlstm_window.WindowCache
"""What a window run in C++ keeps for its backward pass."""


def variational_mask(batch_size: int, hidden_size: int, rate: float, like: Tensor) -> Tensor | None:
    """One inverted-dropout mask per sequence, to be reused at every step of a window (None if rate is 0)."""
    if rate <= 0:
        return None
    keep = 1.0 - rate
    return torch.bernoulli(like.new_full((batch_size, hidden_size), keep)).div_(keep)


class RecurrentLayer(nn.Module):
    """A cell of the configured family, preceded by its own mogrifier when the family has one.

    `state_mask` (state dropout) multiplies h_prev inside every step of the window; the carried
    state is never masked. The fast path runs unless `fast` is False or torch.func transforms
    (grad, vmap, ...), which cannot see through its backward, are active: then autograd does.
    """

    def __init__(self, config: ModelConfig, layer: int, sizes: tuple[int, int] | None = None) -> None:
        """Layer `layer` of the configuration: it reads `config.layer_input_size(layer)` and is H wide, unless
        `sizes` gives its (input size, hidden size) (a family whose layers differ in width)."""
        super().__init__()
        input_size, hidden = sizes or (config.layer_input_size(layer), config.hidden_size)
        self.cell = CELLS[config.cell](input_size, hidden, cap_input_gate=config.cap_input_gate,
                                       chrono_t_max=config.chrono_t_max)
        self.mogrifier = None
        if config.mogrifier_rounds > 0:
            self.mogrifier = Mogrifier(input_size, hidden, config.mogrifier_rounds, config.mogrifier_rank)
        self.fast = True

    def forward(self, inputs: Tensor, state: State, state_mask: Tensor | None = None) -> tuple[Tensor, State]:
        """Outputs h for every step (time, batch, hidden) and the last state."""
        h, c = state
        weights = self._weights()
        if not self.fast or _under_torch_func(inputs, h, c, *weights):
            outputs, state, _ = self.run(autograd_linear, inputs, h, c, state_mask)
            return outputs, state
        if torch.is_grad_enabled() and any(t.requires_grad for t in (inputs, h, c, *weights)):
            outputs, h, c = _FastWindow.apply(self, inputs, h, c, state_mask, *weights)
            return outputs, (h, c)
        with torch.no_grad():
            outputs, state, _ = self.run(Tape(record=False), inputs, h, c, state_mask)
        return outputs, state

    def _window(self) -> ModuleType:
        """The module that runs this layer's window in C++ where `lstm_window.window_kernels` serves it."""
        return rlstm_window if isinstance(self.cell, RLSTMCell) else lstm_window

    def _weights(self) -> list[Tensor]:
        """The tensors the linear maps use now (not `parameters()`, which `functional_call` leaves alone)."""
        return [t for m in self.modules() if isinstance(m, nn.Linear) for t in (m.weight, m.bias) if t is not None]

    def run(self, linear: Linear, inputs: Tensor, h: Tensor, c: Tensor, state_mask: Tensor | None
            ) -> tuple[Tensor, State, tuple[MogrifierWindow | None, list[Cache]] | WindowCache]:
        mogrify = None if self.mogrifier is None else mogrifier_window(self.mogrifier, linear, inputs, state_mask)
        if (kernels := lstm_window.window_kernels(self.cell, mogrify, linear, inputs)) is not None:
            return self._window().forward(kernels, linear, self.cell, mogrify, inputs, h, c, state_mask)
        x_part = linear(self.cell.input, inputs) if mogrify is None else None  # stateless: whole window
        outputs, caches = [], []
        for t in range(inputs.shape[0]):
            if mogrify is None:
                x_part_t, h_seen = x_part[t], h if state_mask is None else h * state_mask
            else:
                x, h_seen = mogrify.forward(t, h)
                x_part_t = linear(self.cell.input, x)
            h, c, cell_cache = self.cell.step(linear, x_part_t, h_seen, c, state_mask)
            outputs.append(h)
            caches.append(cell_cache)
        return torch.stack(outputs), (h, c), (mogrify, caches)

    def run_backward(self, tape: Tape, caches: tuple[MogrifierWindow | None, list[Cache]] | WindowCache,
                     d_outputs: Tensor, dh: Tensor, dc: Tensor, state_mask: Tensor | None
                     ) -> tuple[Tensor, Tensor, Tensor]:
        """Gradients of (inputs, h0, c0) given those of the outputs and of the last state."""
        if isinstance(caches, WindowCache):
            kernels = cpu_kernels.cpu_extension()
            return self._window().backward(kernels, tape, self.cell, caches, d_outputs, dh, dc, state_mask)
        mogrify, cell_caches = caches
        d_x_parts, d_inputs = [], []
        for t in reversed(range(len(cell_caches))):
            d_x_part, dh, dc = self.cell.step_backward(tape, cell_caches[t], dh + d_outputs[t], dc)
            if mogrify is None:
                d_x_parts.append(d_x_part)
            else:
                dx, dh = mogrify.backward(tape, t, tape.backward(self.cell.input, d_x_part), dh)
                d_inputs.append(dx)
            if state_mask is not None:
                dh = dh * state_mask
        if mogrify is None:  # a window of one step stacks to that step's (batch, features): give it its time axis
            d_inputs = tape.backward(self.cell.input, tape.stack(d_x_parts[::-1]))
            return d_inputs.reshape(*d_outputs.shape[:2], d_inputs.shape[-1]), dh, dc
        mogrify.finish_backward(tape)
        return torch.stack(d_inputs[::-1]), dh, dc


def _under_torch_func(*tensors: Tensor) -> bool:
    return any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)


class _FastWindow(torch.autograd.Function):
    """A layer's window as one autograd node with a hand-written backward through time."""

    @staticmethod
    def forward(ctx, layer: RecurrentLayer, inputs: Tensor, h: Tensor, c: Tensor, state_mask: Tensor | None,
                *weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        tape = Tape()
        outputs, (h, c), caches = layer.run(tape, inputs, h, c, state_mask)
        ctx.layer, ctx.tape, ctx.caches, ctx.weights = layer, tape, caches, weights
        ctx.save_for_backward(state_mask)
        return outputs, h, c

    @staticmethod
    @once_differentiable
    def backward(ctx, d_outputs: Tensor, dh: Tensor, dc: Tensor) -> tuple[Tensor | None, ...]:
        (state_mask,) = ctx.saved_tensors
        tape = ctx.tape.for_backward()
        d_inputs, dh, dc = ctx.layer.run_backward(tape, ctx.caches, d_outputs, dh, dc, state_mask)
        return None, d_inputs, dh, dc, None, *tape.parameter_grads(ctx.weights)
