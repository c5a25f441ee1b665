"""The mogrifier over one window, step by step: the reference math, or one fused call per step.

A recurrent layer asks `mogrifier_window` for the object that mogrifies each step's (x, h) and later
takes each step's gradients back; all kinds apply the state-dropout mask to h first. Low-rank
mogrifiers on the fast path take a fused kind, which runs every round of a step in one call and keeps
the window's values in one layout (models/mogrifier_kernels.py): on a GPU one Triton kernel per step
(float32, Triton installed: PyTorch's CUDA builds bring it), on a CPU the C++ kernel of
models/csrc/cpu_kernels.cpp (float32 and float64, where it could be built). Everything else, and
every autograd (reference) run, takes the per-step reference math of `Mogrifier`.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from lm_tuner.models import cpu_kernels
from lm_tuner.models.mogrifier import Mogrifier
from lm_tuner.models.tape import Cache, Linear, Tape
from lm_tuner.models.triton_support import on_device_of, triton_serves

LAUNCH = dict(TILE=32768, num_warps=16, num_stages=1)
"""Triton launch settings of the fused kernels: TILE elements in a (column chunk, rank) tile of a factor, the chunk
as wide as that leaves, up to the widest of x and h (at E = H = 512, rank 40: all columns in one chunk); the fastest
of eight timed on an H100 (benchmarks/mogrifier_kernels.py)."""
MAX_FUSED_RANK = 128
"""Above this a chunk of TILE elements would be narrower than 256 columns, and the kernels have been timed at rank 40
only; such mogrifiers take the reference math on a GPU."""


def _power_of_two_above(size: int) -> int:
    """The smallest power of two >= size, at least 16: Triton's tiles have power-of-two sides."""
    return max(16, 1 << (size - 1).bit_length())


class MogrifierWindow(Protocol):
    def forward(self, step: int, h: Tensor) -> tuple[Tensor, Tensor]:
        """The mogrified (x, h) of `step`, given its unmasked h."""
        ...

    def backward(self, tape: Tape, step: int, dx: Tensor, dh: Tensor) -> tuple[Tensor, Tensor]:
        """Gradients of the step's x and masked h, given those of its mogrified (x, h); steps in reverse.

        May overwrite `dx` and `dh`: callers pass gradients no one else holds."""
        ...

    def finish_backward(self, tape: Tape) -> None:
        """Hand the tape what the weight gradients need, once every step has gone backward."""
        ...


def mogrifier_window(mogrifier: Mogrifier, linear: Linear, inputs: Tensor, state_mask: Tensor | None
                     ) -> MogrifierWindow:
    if fused_kernel_serves(mogrifier, linear, inputs):
        return FusedWindow(mogrifier, linear, inputs, state_mask)
    if cpu_kernel_serves(mogrifier, linear, inputs):
        return CpuKernelWindow(mogrifier, linear, inputs, state_mask)
    return ReferenceWindow(mogrifier, linear, inputs, state_mask)


def _rank(mogrifier: Mogrifier) -> int | None:
    """The rank of the low-rank factors, None for a full-rank mogrifier."""
    maps = mogrifier.projections[0].maps
    return maps[0].out_features if len(maps) == 2 else None


def fused_kernel_serves(mogrifier: Mogrifier, linear: Linear, inputs: Tensor) -> bool:
    """Whether the Triton kernels take this window."""
    rank = _rank(mogrifier)
    return triton_serves(inputs) and isinstance(linear, Tape) and rank is not None and rank <= MAX_FUSED_RANK


def cpu_kernel_serves(mogrifier: Mogrifier, linear: Linear, inputs: Tensor) -> bool:
    """Whether the C++ kernel takes this window (building it on first asking)."""
    return isinstance(linear, Tape) and _rank(mogrifier) is not None and cpu_kernels.serving(inputs) is not None


class ReferenceWindow:
    """Mogrifier.forward and .backward, one step at a time."""

    def __init__(self, mogrifier: Mogrifier, linear: Linear, inputs: Tensor, state_mask: Tensor | None) -> None:
        self.mogrifier, self.linear, self.inputs, self.state_mask = mogrifier, linear, inputs, state_mask
        self.caches: list[Cache] = []

    def forward(self, step: int, h: Tensor) -> tuple[Tensor, Tensor]:
        h_seen = h if self.state_mask is None else h * self.state_mask
        x, h, cache = self.mogrifier(self.linear, self.inputs[step], h_seen)
        self.caches.append(cache)
        return x, h

    def backward(self, tape: Tape, step: int, dx: Tensor, dh: Tensor) -> tuple[Tensor, Tensor]:
        return self.mogrifier.backward(tape, self.caches[step], dx, dh)

    def finish_backward(self, tape: Tape) -> None:
        pass


class WindowLayout:
    """The fused kinds' storage of a window (see models/mogrifier_kernels.py) and what they hand the tape."""

    def __init__(self, mogrifier: Mogrifier, tape: Tape, inputs: Tensor) -> None:
        self.lefts = [projection.maps[0] for projection in mogrifier.projections]
        self.rights = [projection.maps[1] for projection in mogrifier.projections]
        self.rounds = len(self.lefts)
        self.window, self.batch, self.input_size = inputs.shape
        self.hidden_size, self.rank = self.lefts[0].in_features, self.lefts[0].out_features
        self.dims = [self.input_size if j % 2 == 0 else self.hidden_size for j in range(self.rounds + 2)]
        self.values = self._blocks(inputs.new_empty(self.window * self.batch * sum(self.dims)), self.dims)
        self.values[0].copy_(inputs)
        gate_elements = self.window * self.batch * sum(self.dims[:-2])
        self.gates = self._blocks(inputs.new_empty(gate_elements), self.dims[:-2])
        self.z = inputs.new_empty(self.rounds, self.window, self.batch, self.rank)
        if tape.record:  # what the backward pass writes
            self.d_pre = self._blocks(inputs.new_empty(gate_elements), self.dims[:-2])
            self.d_z = torch.empty_like(self.z)
        for r in range(self.rounds):
            tape.add_inputs(self.lefts[r], self.values[r + 1])
            tape.add_inputs(self.rights[r], self.z[r])
        last = self.rounds + 1  # the final x and h are in the last even and the last odd block
        self.last_x, self.last_h = last - last % 2, last - (last + 1) % 2

    def _blocks(self, flat: Tensor, dims: list[int]) -> list[Tensor]:
        blocks, start = [], 0
        for dim in dims:
            size = self.window * self.batch * dim
            blocks.append(flat[start : start + size].view(self.window, self.batch, dim))
            start += size
        return blocks

    def mogrified(self, step: int) -> tuple[Tensor, Tensor]:
        return self.values[self.last_x][step], self.values[self.last_h][step]

    def finish_backward(self, tape: Tape) -> None:
        for r in range(self.rounds):
            tape.add_grads(self.rights[r], self.d_pre[r])
            tape.add_grads(self.lefts[r], self.d_z[r])


class FusedWindow(WindowLayout):
    """All rounds of a step in one Triton kernel launch, forward and backward (see models/mogrifier_kernels.py)."""

    def __init__(self, mogrifier: Mogrifier, tape: Tape, inputs: Tensor, state_mask: Tensor | None,
                 launch: dict | None = None) -> None:
        from lm_tuner.models import mogrifier_kernels

        super().__init__(mogrifier, tape, inputs)
        self.kernels = mogrifier_kernels
        self.launch = LAUNCH if launch is None else launch
        self.state_mask = state_mask
        with torch.no_grad():  # every factor as (columns, rank): see models/mogrifier_kernels.py
            self.left_t = torch.cat([m.weight.t().reshape(-1) for m in self.lefts])
            self.right = torch.cat([m.weight.reshape(-1) for m in self.rights])
            self.bias = torch.cat([m.bias for m in self.rights])

    def _launch_shape(self) -> dict:
        block_k = _power_of_two_above(self.rank)
        launch = dict(self.launch)
        widest = _power_of_two_above(max(self.input_size, self.hidden_size))
        return dict(E=self.input_size, H=self.hidden_size, K=self.rank, ROUNDS=self.rounds, BLOCK_K=block_k,
                    CHUNK=min(widest, max(16, launch.pop("TILE") // block_k)), **launch)

    def _grid(self) -> tuple[int]:
        return (self.batch,)  # a program per row

    def forward(self, step: int, h: Tensor) -> tuple[Tensor, Tensor]:
        h, mask = h.contiguous(), self.state_mask
        with on_device_of(h):
            self.kernels.mogrify_forward[self._grid()](
                self.values[0], self.gates[0], self.z, h, h if mask is None else mask.contiguous(),  # h: unread
                self.left_t, self.right, self.bias, step, self.batch, self.window,
                HAS_MASK=mask is not None, **self._launch_shape())
        return self.mogrified(step)

    def backward(self, tape: Tape, step: int, dx: Tensor, dh: Tensor) -> tuple[Tensor, Tensor]:
        dx, dh = dx.contiguous(), dh.contiguous()
        with on_device_of(dx):
            self.kernels.mogrify_backward[self._grid()](
                dx, dh, self.values[0], self.gates[0], self.d_pre[0], self.d_z, self.left_t, self.right, step,
                self.batch, self.window, **self._launch_shape())
        return dx, dh


class CpuKernelWindow(WindowLayout):
    """All rounds of a step in one call of the C++ kernel, forward and backward (models/csrc/cpu_kernels.cpp)."""

    def __init__(self, mogrifier: Mogrifier, tape: Tape, inputs: Tensor, state_mask: Tensor | None) -> None:
        super().__init__(mogrifier, tape, inputs)
        self.state_mask = None if state_mask is None else state_mask.contiguous()
        detached = [[m.weight.detach() for m in self.lefts], [m.weight.detach() for m in self.rights],
                    [m.bias.detach() for m in self.rights]]
        gradients = (self.d_pre, self.d_z) if tape.record else ([], self.z.new_empty(0))
        extension = cpu_kernels.cpu_extension()
        self.kernel = extension.MogrifierWindow(self.values, self.gates, self.z, *detached, *gradients)

    def forward(self, step: int, h: Tensor) -> tuple[Tensor, Tensor]:
        self.kernel.forward(step, h.contiguous(), self.state_mask)
        return self.mogrified(step)

    def backward(self, tape: Tape, step: int, dx: Tensor, dh: Tensor) -> tuple[Tensor, Tensor]:
        dx, dh = dx.contiguous(), dh.contiguous()
        self.kernel.backward(step, dx, dh)
        return dx, dh
