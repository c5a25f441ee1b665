"""When the Triton kernels (models/mogrifier_kernels.py, models/lstm_kernels.py) serve a computation.

They serve float32 CUDA tensors where Triton is installed (PyTorch's CUDA builds bring it). Triton's
interpreter (TRITON_INTERPRET=1) runs them on CPU tensors with NumPy: slow, but how CI, which has no
GPU, tests them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os

import torch
from torch import Tensor

TRITON_AVAILABLE = importlib.util.find_spec("triton") is not None
TRITON_INTERPRETS = os.environ.get("TRITON_INTERPRET") == "1"


def triton_serves(*tensors: Tensor) -> bool:
    return TRITON_AVAILABLE and all(t.dtype == torch.float32 and (t.is_cuda or TRITON_INTERPRETS) for t in tensors)


def on_device_of(tensor: Tensor) -> contextlib.AbstractContextManager:
    """Makes `tensor`'s GPU the current one: Triton launches on the current device, whatever the tensors'."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()
