"""The optimisers a schedule names (`training.optimizer`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def make_optimizer(name: str, params: Sequence[Tensor], learning_rate: float) -> torch.optim.Optimizer:
    """Adam or RAdam with beta1 = 0 (RMSProp-like, as in Melis et al.), beta2 = 0.999, epsilon = 1e-8; or plain SGD
    (AWD-LSTM's, without momentum; with NT-ASGD averaging on top it is the paper's NT-ASGD)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=learning_rate)
    optimizer = {"adam": torch.optim.Adam, "radam": torch.optim.RAdam}[name]
    return optimizer(params, lr=learning_rate, betas=(0.0, 0.999), eps=1e-8)
