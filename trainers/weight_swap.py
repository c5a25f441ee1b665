"""Swapping other weights (an average, say) into a model for the length of a block, so they can be
scored or checkpointed without disturbing the weights that keep training.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from lm_tuner.models import LanguageModel


@contextmanager
def swapped_weights(model: LanguageModel, weights: Sequence[Tensor]) -> Iterator[LanguageModel]:
    """The model with `weights` in place of its parameters inside the block (a no-op for its own)."""
    params = list(model.parameters())
    if all(weight is param for weight, param in zip(weights, params, strict=True)):
        yield model
        return
    saved = [param.detach().clone() for param in params]
    with torch.no_grad():
        for param, weight in zip(params, weights, strict=True):
            param.copy_(weight)
    try:
        yield model
    finally:
        with torch.no_grad():
            for param, value in zip(params, saved, strict=True):
                param.copy_(value)
