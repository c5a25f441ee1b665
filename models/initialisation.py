"""Initialisation shared by the cells, the mogrifier and the language model (docs/methodology.md, Initialisation)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def truncated_normal_(tensor: Tensor, std: float) -> Tensor:
    return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2 * std, b=2 * std)


def init_forget_bias_(bias: Tensor, chrono_t_max: float) -> None:
    """Mean 1 with std sqrt(1/n), or chrono init ln U(1, T_max - 1) when `chrono_t_max` > 0."""
    with torch.no_grad():
        if chrono_t_max > 0:
            bias.uniform_(1.0, chrono_t_max - 1.0).log_()
        else:
            truncated_normal_(bias, math.sqrt(1.0 / bias.numel())).add_(1.0)
