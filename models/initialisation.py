"""Initialisation shared by the cells, the mogrifier and the language model (docs/methodology.md, Initialisation)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

TRUNCATION = 2.0
"""Truncated normals keep the draws within this many pre-truncation standard deviations of the mean."""


def _truncated_variance_ratio(bound: float) -> float:
    """Var of N(0, 1) truncated at +-bound: 1 - 2 bound phi(bound) / (Phi(bound) - Phi(-bound))."""
    density = math.exp(-bound * bound / 2) / math.sqrt(2 * math.pi)
    return 1.0 - 2 * bound * density / math.erf(bound / math.sqrt(2))


PRE_TRUNCATION_STD_FACTOR = 1.0 / math.sqrt(_truncated_variance_ratio(TRUNCATION))
"""About 1.1368: truncating at +-2 sigma leaves a standard deviation of sigma / 1.1368 (variance factor 1.2924)."""


def pre_truncation_std(effective_std: float) -> float:
    """The std to draw a normal truncated at +-2 std with, so that the draws have standard deviation `effective_std`.

    The reference (deepmind/lamb, `utils.variance_scaling_initializer`) multiplies the variance by a rounded 1.3
    instead of the exact 1.2924, which leaves its draws 0.3% wider than the std it aims for. We use the exact factor,
    so that the effective std is exactly the one docs/methodology.md states; 0.3% is far below any effect on training.
    """
    return effective_std * PRE_TRUNCATION_STD_FACTOR


def truncated_normal_(tensor: Tensor, std: float) -> Tensor:
    """Draw from N(0, std^2) truncated at +-2 std: `std` is the pre-truncation one (the draws' std is std / 1.137)."""
    return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-TRUNCATION * std, b=TRUNCATION * std)


def init_tile_(tile: Tensor, fan_in: int, mean: float = 0.0) -> Tensor:
    """The cell initialiser of the reference, for one tile: draws with mean `mean` and std sqrt(1 / fan_in).

    A tile is the block of a weight matrix that maps one input (x, h, ...) to one gate, or a gate's bias; `fan_in`
    is the size of the vector the tile multiplies (for a bias, the size of the gate, as in the reference). Tiles
    that share a fan-in may be drawn in one call: their entries are independent either way.
    """
    if fan_in <= 0:
        raise ValueError(f"fan_in must be a positive size, got {fan_in}")
    with torch.no_grad():
        return truncated_normal_(tile, pre_truncation_std(math.sqrt(1.0 / fan_in))).add_(mean)


def init_forget_bias_(bias: Tensor, chrono_t_max: float) -> None:
    """Mean 1 with std sqrt(1/n) (the reference), or chrono init ln U(1, T_max - 1) when `chrono_t_max` > 0."""
    if chrono_t_max > 0:
        with torch.no_grad():
            bias.uniform_(1.0, chrono_t_max - 1.0).log_()
    else:
        init_tile_(bias, bias.numel(), mean=1.0)
