"""The Transformer family's block: pre-LayerNorm causal self-attention and a feed-forward network, each on a residual
branch (Vaswani et al., 2017, Attention Is All You Need, section 3; the LayerNorm in front of each branch as in
Xiong et al., 2020, On Layer Normalization in the Transformer Architecture), with rotary positions optional
(Su et al., 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding).

Shapes: x (batch, time, width); the block reads the whole context at once, causally, and carries no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lm_tuner.models.initialisation import truncated_normal_

FEED_FORWARD_RATIO = 4
"""The feed-forward network's inner width over the model's width (Vaswani et al. 2017, section 3.3: 2048 / 512)."""

ROTARY_BASE = 10_000.0
"""theta_i = base^(-2i / head width), the frequencies of rotary positions (Su et al. 2021, section 3.2.2)."""


@dataclass(frozen=True)
class BlockDropout:
    """The rates a block drops at (already zero outside training): the attention weights, the output of each
    residual branch before it joins the residual stream, and the feed-forward network's hidden activations."""

    attention: float = 0.0
    residual: float = 0.0
    feed_forward: float = 0.0


def rotate(x: Tensor, positions: Tensor) -> Tensor:
    """Rotary position embedding of queries or keys x (batch, heads, time, head width) at `positions` (time,).

    The first and second halves of each head's features form the pairs rotated by position * theta_i (the
    GPT-NeoX arrangement of Su et al.'s pairs, the same map up to a fixed permutation of the features), so that
    the dot product of a rotated query and key depends on their positions only through their difference.
    """
    half = x.shape[-1] // 2
    exponents = torch.arange(half, device=x.device, dtype=torch.float32) / half
    angles = positions.to(torch.float32)[:, None] * ROTARY_BASE ** -exponents[None, :]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


class TransformerBlock(nn.Module):
    """x + attention(LayerNorm(x)), then x + feed_forward(LayerNorm(x)); the feed-forward network's activation is
    the GELU (Hendrycks & Gimpel, 2016) of GPT-2 and BERT where Vaswani et al. had the ReLU.

    Weights are truncated normals with std sqrt(1 / fan-in), like the recurrent cells' (docs/methodology.md,
    Initialisation); the two matrices that write into the residual stream are scaled down by sqrt(2 x layers), so
    that the stream's variance does not grow with depth (Radford et al., 2019, GPT-2, section 2.3). Biases start at 0.
    """

    def __init__(self, width: int, heads: int, *, rotary: bool, layers: int) -> None:
        super().__init__()
        self.hidden_size, self.heads, self.rotary = width, heads, rotary
        inner = FEED_FORWARD_RATIO * width
        self.attention_norm = nn.LayerNorm(width)
        self.query_key_value = nn.Linear(width, 3 * width)
        self.attention_output = nn.Linear(width, width)
        self.feed_forward_norm = nn.LayerNorm(width)
        self.feed_forward_in = nn.Linear(width, inner)
        self.feed_forward_out = nn.Linear(inner, width)
        depth_scale = 1.0 / math.sqrt(2 * layers)
        for linear, scale in ((self.query_key_value, 1.0), (self.attention_output, depth_scale),
                              (self.feed_forward_in, 1.0), (self.feed_forward_out, depth_scale)):
            truncated_normal_(linear.weight, scale * math.sqrt(1.0 / linear.in_features))
            nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor, dropout: BlockDropout) -> Tensor:
        x = x + _dropout(self._attention(self.attention_norm(x), dropout.attention), dropout.residual)
        hidden = _dropout(nn.functional.gelu(self.feed_forward_in(self.feed_forward_norm(x))), dropout.feed_forward)
        return x + _dropout(self.feed_forward_out(hidden), dropout.residual)

    def _attention(self, x: Tensor, dropout: float) -> Tensor:
        batch, time, width = x.shape
        query, key, value = (part.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # (batch, heads, time, head)
                             for part in self.query_key_value(x).chunk(3, dim=-1))
        if self.rotary:
            positions = torch.arange(time, device=x.device)
            query, key = rotate(query, positions), rotate(key, positions)
        attended = nn.functional.scaled_dot_product_attention(query, key, value, dropout_p=dropout, is_causal=True)
        return self.attention_output(attended.transpose(1, 2).reshape(batch, time, width))


def _dropout(x: Tensor, rate: float) -> Tensor:
    return nn.functional.dropout(x, rate) if rate > 0 else x
