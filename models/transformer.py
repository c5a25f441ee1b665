"""The Transformer family's language model (docs/families.md#transformer): a decoder-only, pre-LayerNorm Transformer
between the (tied, for words) embedding and softmax every family has.

It is trained on the same windows as the recurrent families, and nothing computed from one window is carried into
the next: the only "state" is the stream's last tokens (ids, no activations), kept so that a window shorter than
the family's `context_length` is read after as many of the tokens before it as fit. With `context_length` equal
to the training bptt, a training or evaluation window of that length reads itself alone (the kept tokens go
unused); dynamic evaluation, which reads the stream a few tokens at a time, then sees each token after up to
`context_length` - 1 tokens, as in training. A window longer than `context_length` is read in consecutive pieces
of that many tokens (the last may be shorter), each after as many of the tokens before it as fit.

The dropout rates every family has are mapped as follows: `embedding_dropout` drops whole words (as for every
family), `input_dropout` the embedded window, `state_dropout` the attention weights (what connects a step to the
steps before it), `inter_layer_dropout` each residual branch's output (Vaswani et al.'s "residual dropout"),
`cell_output_dropout` the feed-forward network's hidden activations, and `output_dropout` the last LayerNorm's
output (and the projection's, as for every family). `residual_connections` and the recurrent cells' settings
(`cap_input_gate`, `chrono_t_max`) do not apply: the blocks are residual by construction.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor, nn

from lm_tuner.models.config import ModelConfig
from lm_tuner.models.initialisation import truncated_normal_
from lm_tuner.models.language_model import LanguageModel, MixtureOfSoftmaxes
from lm_tuner.models.transformer_block import FEED_FORWARD_RATIO, BlockDropout, TransformerBlock

TokenContext = tuple[Tensor]
"""(tokens,): the stream's last tokens (batch, at most context_length - 1), the ids a next window is read after."""


def width_multiple(config: ModelConfig) -> int:
    """The widths a model can have are the multiples of this: of the heads, twice that with rotary positions (each
    head's features are rotated in pairs)."""
    return config.option("attention_heads") * (2 if config.option("rotary_positions") else 1)


def buildable_width(config: ModelConfig) -> int:
    """The smallest width a model can have that is at least `config.hidden_size`."""
    multiple = width_multiple(config)
    return -(-config.hidden_size // multiple) * multiple


def parameter_count(config: ModelConfig) -> int:
    """Trainable parameters of the model at `buildable_width(config)`: exact for a width a model can have. A width
    between two multiples costs as much as the next one, so the budget solver (models/budget.py), which looks for
    the largest width within the budget, lands on a multiple of `width_multiple`."""
    config = replace(config, hidden_size=buildable_width(config))
    vocab, embed, width, components = config.vocab_size, config.embedding_size, config.hidden_size, \
        config.softmax_components
    block = 2 * 2 * width + 4 * width * width + 4 * width  # two LayerNorms; query, key, value and output maps
    block += 2 * FEED_FORWARD_RATIO * width * width + FEED_FORWARD_RATIO * width + width  # the feed-forward network
    total = vocab * embed + config.num_layers * block + 2 * width + vocab  # embedding, blocks, last norm, bias
    total += 0 if embed == width else embed * width  # the input projection
    total += 0 if config.option("rotary_positions") else config.option("context_length") * width
    total += 0 if config.tie_embeddings else vocab * embed
    if components > 1:
        total += width * components * embed + components * embed + width * components
    elif embed != width:
        total += width * embed
    return total


class TransformerLayers(nn.Module):
    """Everything between the embedding and the output layers, as `LanguageModel.layers` (so that a parameter
    breakdown counts it where it counts the recurrent layers): the E -> H projection of the embedded tokens where
    E < H, the learned positions (without rotary ones), the blocks and the last LayerNorm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        width, embed, multiple = config.hidden_size, config.embedding_size, width_multiple(config)
        if width % multiple:
            rotary = " times 2 for rotary positions" if config.option("rotary_positions") else ""
            raise ValueError(f"hidden_size: got {width}; allowed: a multiple of {multiple} (attention_heads "
                             f"{config.option('attention_heads')}{rotary}) for family {config.family!r}")
        self.input_projection = None
        if embed != width:
            self.input_projection = nn.Linear(embed, width, bias=False)
            nn.init.orthogonal_(self.input_projection.weight)
        self.positions = None
        if not config.option("rotary_positions"):
            self.positions = nn.Parameter(truncated_normal_(torch.empty(config.option("context_length"), width),
                                                            math.sqrt(1.0 / width)))
        heads, rotary = config.option("attention_heads"), config.option("rotary_positions")
        self.blocks = nn.ModuleList(TransformerBlock(width, heads, rotary=rotary, layers=config.num_layers)
                                    for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(width)

    def forward(self, x: Tensor, dropout: BlockDropout) -> Tensor:
        """(batch, time, E) embedded tokens, at most context_length of them -> (batch, time, H)."""
        if self.input_projection is not None:
            x = self.input_projection(x)
        if self.positions is not None:
            x = x + self.positions[: x.shape[1]]
        for block in self.blocks:
            x = block(x, dropout)
        return self.final_norm(x)


class TransformerLanguageModel(LanguageModel):
    """The Transformer family's model; `LanguageModel(config)` builds it. Its top-level parts are those of every
    `LanguageModel`, so that dynamic evaluation, weight averaging and parameter breakdowns treat it alike."""

    def __init__(self, config: ModelConfig) -> None:
        nn.Module.__init__(self)  # not LanguageModel's: its layers are not recurrent cells
        self.config, self.dropout_multiplier, self.cuda_graphs = config, 1.0, False
        self.context_length = config.option("context_length")
        embed, width = config.embedding_size, config.hidden_size
        self.embedding = nn.Embedding(config.vocab_size, embed)
        truncated_normal_(self.embedding.weight, math.sqrt(1.0 / embed))
        self.layers = TransformerLayers(config)
        self.projection = self.mixture = self.output_embedding = None
        if config.softmax_components > 1:
            self.mixture = MixtureOfSoftmaxes(width, embed, config.softmax_components)
        elif embed != width:
            self.projection = nn.Linear(width, embed, bias=False)
            nn.init.orthogonal_(self.projection.weight)
        if not config.tie_embeddings:
            self.output_embedding = nn.Parameter(truncated_normal_(torch.empty(config.vocab_size, embed),
                                                                   math.sqrt(1.0 / embed)))
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))

    def initial_state(self, batch_size: int) -> list[TokenContext]:
        """No tokens before the stream's first."""
        return [(torch.zeros(batch_size, 0, dtype=torch.long, device=self.output_bias.device),)]

    def forward(self, tokens: Tensor, state: list[TokenContext]) -> tuple[Tensor, list[TokenContext]]:
        """Logits (time, batch, vocab) for a window of token ids (time, batch), and the tokens to read the next
        window after."""
        config, context, steps = self.config, self.context_length, tokens.shape[0]
        (kept,) = state[0]
        kept = kept[:, kept.shape[1] - min(kept.shape[1], max(0, context - steps)):].t()  # (earlier, batch): used
        x = self._dropout(self._embed_after(kept, tokens), config.input_dropout).transpose(0, 1)
        dropout = BlockDropout(attention=self._rate(config.state_dropout),
                               residual=self._rate(config.inter_layer_dropout),
                               feed_forward=self._rate(config.cell_output_dropout))
        earlier, pieces = kept.shape[0], []
        for start in range(0, steps, context):
            end = min(start + context, steps)
            read = self.layers(x[:, max(0, earlier + end - context) : earlier + end], dropout)
            pieces.append(read[:, read.shape[1] - (end - start):])
        output = torch.cat(pieces, dim=1).transpose(0, 1)
        stream = torch.cat((kept, tokens))
        next_kept = stream[stream.shape[0] - min(stream.shape[0], context - 1):].t().contiguous()
        return self._logits(self._dropout(output, config.output_dropout)), [(next_kept,)]

    def _embed_after(self, kept: Tensor, tokens: Tensor) -> Tensor:
        """The embedded (earlier + time, batch, E) tokens; embedding dropout removes the same words from both.

        The window's tokens go through the embedding module, the earlier ones through its weight alone: dynamic
        evaluation (trainers/dynamic_evaluation.py) hooks the module and expects to see exactly the window's.
        """
        window = self.embedding(tokens)
        earlier = nn.functional.embedding(kept, self.embedding.weight)
        rate = self._rate(self.config.embedding_dropout)
        if rate > 0:
            keep = 1.0 - rate
            row_mask = torch.bernoulli(window.new_full((self.config.vocab_size,), keep)).div_(keep)
            window, earlier = window * row_mask[tokens].unsqueeze(-1), earlier * row_mask[kept].unsqueeze(-1)
        return torch.cat((earlier, window))
