"""How the cells apply their linear maps: through autograd, or on a tape for a hand-written backward.

Cells are written once, against `linear(module, inputs)`. The reference path passes `autograd_linear`
and lets autograd differentiate the step. The fast path passes a `Tape`, which applies the same maps
with the fastest matrix multiply available and records what each weight saw, so that after the
backward pass through time every weight gradient is one large matrix multiply over the whole window
instead of one small one per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch
from torch import Tensor, nn

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
_ONEDNN_MIN_WEIGHT = 1 << 16
"""Below this many weights oneDNN's per-call overhead outweighs its faster kernel (measured on CPU)."""
_ONEDNN_MIN_ROWS = 8
"""Nor does it pay below this many rows: batch-1 evaluation's matrix-vector products ran 1.3-4x faster
without it on a 2-core Intel Xeon, family 6 model 167 (weights 1268 x 317 and 2048 x 512, 1 and 2 threads)."""


def _cpu_is_intel() -> bool:
    """Whether /proc/cpuinfo names Intel as the CPU's vendor (False where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in cpuinfo)
    except OSError:
        return False


_PREFER_MKL = _cpu_is_intel() and torch.backends.mkl.is_available()
"""The backward pass's products (input gradients step by step, weight gradients per window), and the forward
products of a whole window, through torch's own matmul instead of oneDNN: on Intel, MKL runs them faster and
needs no transposed copies (2-core Xeon, 6/167: LSTM and Mogrifier training steps 1.15x and 1.12x faster). On
AMD CPUs MKL runs at about half oneDNN's speed, so there oneDNN keeps them."""
_MKL_MIN_ROWS = 512
"""Where MKL is preferred, it takes forward products from this many rows on: (1120, 512)
inputs times a (2048, 512) weight took 0.97x oneDNN's time on 1 thread and 0.97x on 2, (19200, 512) 0.91x on both
(2-core Xeon, 6/167); at 32 rows, a step's, oneDNN was faster (1.03x and 1.26x)."""


def fast_linear(inputs: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`inputs @ weight.T + bias`, with oneDNN for large float32 weights and inputs of several rows on CPU.

    PyTorch's CPU matmul goes to MKL, which on some CPUs (AMD among them) runs at half the speed of
    oneDNN, the library behind `torch.nn.LSTM` on CPU. Elsewhere this is `F.linear`.
    """
    if _uses_onednn(inputs, weight):
        return torch.ops.mkldnn._linear_pointwise(inputs, weight, bias, "none", [], "")
    return nn.functional.linear(inputs, weight, bias)


def _uses_onednn(inputs: Tensor, weight: Tensor) -> bool:
    rows = inputs.numel() // max(inputs.shape[-1], 1)
    return (_ONEDNN and inputs.device.type == "cpu" and inputs.dtype == torch.float32
            and weight.numel() >= _ONEDNN_MIN_WEIGHT and rows >= _ONEDNN_MIN_ROWS
            and not (_PREFER_MKL and rows >= _MKL_MIN_ROWS))


def _packed(inputs: Tensor, weight: Tensor) -> Tensor | None:
    """`weight` reordered into oneDNN's blocked layout for `inputs`' rows, where oneDNN takes the product.

    A layer applies each recurrent weight once per step to a few rows. Unpacked, oneDNN reorders the weight
    on every call; packed once per window, the per-step product of a (32, 512) input with a (2048, 512)
    weight took 0.61 ms instead of 0.72 ms forward and 0.66 instead of 0.73 backward (Zen 4, 1 thread).
    """
    if not _uses_onednn(inputs, weight):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), inputs.shape[0])


class Linear(Protocol):
    def __call__(self, module: nn.Linear, inputs: Tensor) -> Tensor: ...


Cache = tuple[Tensor | None, ...]
"""What a step keeps for its backward pass."""


def autograd_linear(module: nn.Linear, inputs: Tensor) -> Tensor:
    return module(inputs)


class Tape:
    """Applies linear maps and records their inputs (forward) and output gradients (backward).

    A module is used either once per step with (batch, features) inputs, or once per window with
    (time, batch, features) inputs. Backward calls come in reverse time order.
    """

    def __init__(self, record: bool = True) -> None:
        self.record = record
        self._weights: dict[nn.Linear, tuple[Tensor, Tensor | None]] = {}
        self._transposed: dict[nn.Linear, Tensor] = {}
        self._inputs: dict[nn.Linear, list[Tensor]] = {}
        self._grads: dict[nn.Linear, list[Tensor]] = {}
        self._stacks: dict[tuple[int, ...], Tensor] = {}
        self._per_step: dict[tuple[nn.Linear, bool], Tensor | None] = {}
        self._used_once: set[tuple[nn.Linear, bool]] = set()

    def __call__(self, module: nn.Linear, inputs: Tensor) -> Tensor:
        weights = self._weights.get(module)
        if weights is None:  # looking parameters up on a Module is slow for a per-step call
            weights = self._weights[module] = (module.weight, module.bias)
        if self.record:
            self._inputs.setdefault(module, []).append(inputs)
        if inputs.dim() == 2 and (packed := self._per_step_weight(module, False, inputs, weights[0])) is not None:
            return torch.ops.mkldnn._linear_pointwise(inputs, packed, weights[1], "none", [], "")
        return fast_linear(inputs, *weights)

    def _per_step_weight(self, module: nn.Linear, transposed: bool, inputs: Tensor, weight: Tensor) -> Tensor | None:
        """The packed weight (or its transpose) for a per-step product, packed on its second use in the window.

        The first use only marks the module: packing costs about as much as one product, so it pays from
        the second step on and would not in a window of one step (generation, say)."""
        key = (module, transposed)
        if key in self._per_step:
            return self._per_step[key]
        if key not in self._used_once:
            self._used_once.add(key)
            return None
        packed = self._per_step[key] = _packed(inputs, weight.detach().t().contiguous() if transposed else weight)
        return packed

    def weights(self, module: nn.Linear) -> tuple[Tensor, Tensor | None]:
        """`module`'s (weight, bias) as this window's forward pass saw them (detached), for a caller that runs
        a whole window's steps itself (models/lstm_window.py): a weight swapped in by `functional_call` (the
        AWD-LSTM's weight drop) is gone from the module by the time the backward pass runs."""
        weight, bias = self._weights.setdefault(module, (module.weight, module.bias))
        return weight.detach(), None if bias is None else bias.detach()

    def packed_weight(self, module: nn.Linear, rows: Tensor, transposed: bool = False) -> Tensor | None:
        """`module`'s weight (or its transpose) packed for oneDNN products with inputs like `rows`, for a caller
        that runs a whole window's steps itself; None where oneDNN does not take them."""
        weight = self.weights(module)[0]
        if transposed and (_PREFER_MKL or not _uses_onednn(rows, weight)):
            return None
        return _packed(rows, weight.t().contiguous() if transposed else weight)

    def add_inputs(self, module: nn.Linear, inputs: Tensor) -> None:
        """Record what `module` saw over the whole window (time, batch, features), applied elsewhere."""
        self._weights.setdefault(module, (module.weight, module.bias))
        if self.record:
            self._inputs.setdefault(module, []).append(inputs)

    def add_grads(self, module: nn.Linear, grad_outputs: Tensor) -> None:
        """Record the gradient of `module`'s outputs over the whole window, computed elsewhere."""
        self._grads.setdefault(module, []).append(grad_outputs)

    def for_backward(self) -> Tape:
        """A tape with this one's forward records and none of its gradients (a graph may be run twice)."""
        tape = Tape()
        tape._weights, tape._transposed, tape._inputs = self._weights, self._transposed, self._inputs
        return tape

    def backward(self, module: nn.Linear, grad_outputs: Tensor) -> Tensor:
        """The gradient with respect to the inputs of `module`, given that of its outputs."""
        self._grads.setdefault(module, []).append(grad_outputs)
        weight = self._weights[module][0].detach()
        if grad_outputs.device.type == "cpu" and (_PREFER_MKL or not _uses_onednn(grad_outputs, weight)):
            return grad_outputs @ weight  # MKL, or too few rows to pay for oneDNN's transposed copy
        packed = self._per_step_weight(module, True, grad_outputs, weight) if grad_outputs.dim() == 2 else None
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(grad_outputs, packed, None, "none", [], "")
        transposed = self._transposed.get(module)
        if transposed is None:  # oneDNN is much faster with a contiguous right operand
            transposed = self._transposed[module] = weight.t().contiguous()
        return fast_linear(grad_outputs, transposed)

    def stack(self, steps: list[Tensor]) -> Tensor:
        """torch.stack(steps), made once per list of tensors (an LSTM's gate gradients feed two weights)."""
        key = tuple(map(id, steps))
        if key not in self._stacks:
            self._stacks[key] = steps[0] if len(steps) == 1 else torch.stack(steps)
        return self._stacks[key]

    def parameter_grads(self, parameters: Iterable[Tensor]) -> list[Tensor | None]:
        """The gradient of each of `parameters` summed over the window (None for one never used)."""
        grads: dict[Tensor, Tensor] = {}
        transposed: dict[tuple, Tensor] = {}  # an LSTM's gate gradients feed two weights
        for module, (weight, bias) in self._weights.items():
            inputs, grad_outputs = self.stack(self._inputs[module]), self.stack(self._grads[module][::-1])
            inputs, grad_outputs = inputs.reshape(-1, inputs.shape[-1]), grad_outputs.reshape(-1, weight.shape[0])
            if _uses_onednn(inputs, weight) and not _PREFER_MKL:  # copies both operands, still faster
                key = (grad_outputs.data_ptr(), grad_outputs.shape, grad_outputs.stride())
                if key not in transposed:  # copied once: 2.7 ms for (1120, 2048) on Zen 4
                    transposed[key] = grad_outputs.t().contiguous()
                grads[weight] = fast_linear(transposed[key], inputs.t())
            else:
                grads[weight] = grad_outputs.t() @ inputs
            if bias is not None:
                grads[bias] = grad_outputs.sum(0)
        return [grads.get(parameter) for parameter in parameters]
