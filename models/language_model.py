"""The recurrent language model: embedding -> recurrent layers (skip combination) -> softmax."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from models.cells import LSTMLayer, State, truncated_normal_
from models.config import ModelConfig


class LanguageModel(nn.Module):
    """A stack of LSTM (or Mogrifier LSTM) layers whose outputs are summed (skip combination).

    Word-level models tie the softmax to the input embedding; when the embedding is smaller than the
    hidden state, a bias-free projection maps the summed output to the embedding size first.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.dropout_multiplier = 1.0  # Monte-Carlo evaluation scales every rate (see monte_carlo_dropout)
        embed, hidden = config.embedding_size, config.hidden_size
        self.embedding = nn.Embedding(config.vocab_size, embed)
        truncated_normal_(self.embedding.weight, math.sqrt(1.0 / embed))
        self.layers = nn.ModuleList(
            LSTMLayer(
                config.layer_input_size(layer),
                hidden,
                cap_input_gate=config.cap_input_gate,
                mogrifier_rounds=config.mogrifier_rounds,
                mogrifier_rank=config.mogrifier_rank,
            )
            for layer in range(config.num_layers)
        )
        self.projection = None
        if config.has_projection:
            self.projection = nn.Linear(hidden, embed, bias=False)
            nn.init.orthogonal_(self.projection.weight)
        self.output_embedding = None
        if not config.tie_embeddings:
            self.output_embedding = nn.Parameter(truncated_normal_(torch.empty(config.vocab_size, embed),
                                                                   math.sqrt(1.0 / embed)))
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))

    def initial_state(self, batch_size: int) -> list[State]:
        device = self.output_bias.device
        zeros = torch.zeros(batch_size, self.config.hidden_size, device=device)
        return [(zeros, zeros) for _ in self.layers]

    def forward(self, tokens: Tensor, state: list[State]) -> tuple[Tensor, list[State]]:
        """Logits (time, batch, vocab) for a window of token ids (time, batch), and the next state."""
        config = self.config
        x = self._dropout(self.embedding(tokens), config.input_dropout)
        summed = None
        next_state = []
        for index, (layer, layer_state) in enumerate(zip(self.layers, state, strict=True)):
            layer_input = x if index == 0 else self._dropout(x, config.inter_layer_dropout)
            x, new_layer_state = layer(layer_input, layer_state, config.state_dropout * self.dropout_multiplier)
            next_state.append(new_layer_state)
            summed = x if summed is None else summed + x
        output = self._dropout(summed, config.output_dropout)
        if self.projection is not None:
            output = self._dropout(self.projection(output), config.output_dropout)
        softmax_weight = self.embedding.weight if self.output_embedding is None else self.output_embedding
        return nn.functional.linear(output, softmax_weight, self.output_bias), next_state

    def _dropout(self, x: Tensor, rate: float) -> Tensor:
        rate *= self.dropout_multiplier
        return nn.functional.dropout(x, rate, training=self.training) if rate > 0 else x


@contextmanager
def monte_carlo_dropout(model: LanguageModel, multiplier: float) -> Iterator[LanguageModel]:
    """Dropout on at every rate times `multiplier` (gradients still off if the caller disables them).

    Inside the block each forward pass draws fresh masks; averaging the predicted probabilities of
    many passes is Monte-Carlo dropout evaluation. The previous mode is restored on exit.
    """
    if not 0.0 <= multiplier:
        raise ValueError(f"multiplier: got {multiplier!r}; allowed: a number >= 0")
    was_training, previous = model.training, model.dropout_multiplier
    model.train()
    model.dropout_multiplier = multiplier
    try:
        yield model
    finally:
        model.dropout_multiplier = previous
        model.train(was_training)


def detach_state(state: list[State]) -> list[State]:
    """Cut the graph between windows (truncated BPTT) while carrying the values."""
    return [(h.detach(), c.detach()) for h, c in state]
