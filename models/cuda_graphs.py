"""CUDA graphs of the recurrent layers' training windows.

On a GPU one window of a layer is hundreds of small kernels per time step (the mogrifier's rounds,
the gates, their hand-written backward), so launching them, not the arithmetic, bounds the fast
path: measured on an H100, the Mogrifier trained at 0.05x the FLOP/s of cuDNN's LSTM. A layer's
window (forward and backward) is captured once per shape as a CUDA graph and then replayed, which
launches all of its kernels at once. The layer runs no random numbers of its own (its dropout mask
comes in as an argument), so a replay computes exactly what the eager call would.

Graphs serve training windows on CUDA only; evaluation, CPU runs and shapes beyond the first few
(variable BPTT) run eagerly.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lm_tuner.models.recurrence import RecurrentLayer, State

MAX_GRAPHS_PER_LAYER = 4  # each graph keeps its window's activations in a memory pool of its own

_graphs: weakref.WeakKeyDictionary[RecurrentLayer, dict[tuple, Callable[..., tuple[Tensor, ...]]]]
_graphs = weakref.WeakKeyDictionary()


class _Window(nn.Module):
    """A layer's window with flat tensor arguments, as graph capture needs them."""

    def __init__(self, layer: RecurrentLayer) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, inputs: Tensor, h: Tensor, c: Tensor, *state_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        outputs, (h, c) = self.layer(inputs, (h, c), state_mask[0] if state_mask else None)
        return outputs, h, c


def captured_graphs(model: nn.Module) -> int:
    """How many training windows of `model`'s layers are captured as CUDA graphs so far. A capture takes seconds (its
    warm-up runs, kernels compiled on the first): whoever times steps waits until a step captures none."""
    return sum(len(_graphs.get(module, ())) for module in model.modules() if isinstance(module, RecurrentLayer))


def run_layer(layer: nn.Module, inputs: Tensor, state: State, state_mask: Tensor | None,
              use_graphs: bool) -> tuple[Tensor, State]:
    """The layer over a window, replaying its CUDA graph where one serves (see the module's docstring).

    Only the (h, c) layers of models/recurrence.py are graphed; other layers (the GRU's, whose state is (h,) and
    whose plain window is cuDNN's fused kernel) run eagerly."""
    if not isinstance(layer, RecurrentLayer):
        return layer(inputs, state, state_mask)
    h, c = state
    args = (inputs, h, c) if state_mask is None else (inputs, h, c, state_mask)
    if not (use_graphs and layer.fast and inputs.is_cuda and layer.training and torch.is_grad_enabled()
            and not torch.cuda.is_current_stream_capturing()):
        return layer(inputs, state, state_mask)
    key = tuple((t.shape, t.dtype, t.requires_grad) for t in args)
    graphs = _graphs.setdefault(layer, {})
    if key not in graphs:
        if len(graphs) >= MAX_GRAPHS_PER_LAYER:
            return layer(inputs, state, state_mask)
        samples = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in args)
        # The capture warms the window up on a side stream, where the parameters' gradient accumulators are made;
        # later backward passes on the default stream then warn of the mismatch at every step (torch synchronises
        # the two, which is all the warning is about), ten lines into every plan and trial log on a GPU.
        quiet = getattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch", None)  # not in older torch
        if quiet is not None:
            quiet(False)
        graphs[key] = torch.cuda.make_graphed_callables(_Window(layer), samples)
    outputs, h, c = graphs[key](*args)
    return outputs, (h, c)
