"""The recurrent language model: embedding -> recurrent layers (skip or residual) -> softmax."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from lm_tuner.models import families
from lm_tuner.models.config import ModelConfig
from lm_tuner.models.cuda_graphs import run_layer
from lm_tuner.models.initialisation import truncated_normal_
from lm_tuner.models.recurrence import RecurrentLayer, State, variational_mask


class MixtureOfSoftmaxes(nn.Module):
    """K softmaxes over tanh projections of the output, mixed by a softmax prior (Yang et al., 2018)."""

    def __init__(self, hidden_size: int, embedding_size: int, components: int) -> None:
        super().__init__()
        self.components, self.embedding_size = components, embedding_size
        self.latent = nn.Linear(hidden_size, components * embedding_size)
        self.prior = nn.Linear(hidden_size, components, bias=False)
        std = math.sqrt(1.0 / hidden_size)
        truncated_normal_(self.latent.weight, std)
        truncated_normal_(self.latent.bias, std)
        truncated_normal_(self.prior.weight, std)

    def forward(self, output: Tensor, softmax_weight: Tensor, softmax_bias: Tensor, dropout: float) -> Tensor:
        """Log-probabilities (..., vocab); `dropout` (a rate) drops the projected outputs, as after a projection."""
        latent = torch.tanh(self.latent(output)).unflatten(-1, (self.components, self.embedding_size))
        latent = nn.functional.dropout(latent, dropout) if dropout > 0 else latent
        log_probs = nn.functional.log_softmax(nn.functional.linear(latent, softmax_weight, softmax_bias), dim=-1)
        log_prior = nn.functional.log_softmax(self.prior(output), dim=-1).unsqueeze(-1)
        return torch.logsumexp(log_probs + log_prior, dim=-2)


class LanguageModel(nn.Module):
    """A stack of recurrent layers between an embedding and a (tied, for words) softmax.

    With skip connections each layer reads the one below and the output is the sum of all layers'
    outputs; with residual connections each layer reads the sum of the outputs of all layers below
    it. When the embedding is smaller than the hidden state, a bias-free projection maps the summed
    output to the embedding size before a single softmax.

    `LanguageModel(config)` builds the class the family's `Family.model` names where it has one (a subclass that
    may size and wire its layers differently, such as models.awd_lstm's); the output layers take the width of
    the last layer.
    """

    def __new__(cls, config: ModelConfig | None = None, *args: Any, **kwargs: Any) -> LanguageModel:
        own_model = None if config is None else families.family(config.family).model
        if cls is LanguageModel and own_model is not None:
            cls = own_model()
        return super().__new__(cls)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.dropout_multiplier = 1.0  # Monte-Carlo evaluation scales every rate (see monte_carlo_dropout)
        self.cuda_graphs = True  # replay training windows as CUDA graphs on a GPU (see models.cuda_graphs)
        embed = config.embedding_size
        self.embedding = nn.Embedding(config.vocab_size, embed)
        truncated_normal_(self.embedding.weight, math.sqrt(1.0 / embed))
        self.layers = nn.ModuleList(self._recurrent_layers())
        output = self.layers[-1].cell.hidden_size
        self.projection = None
        if output != embed and config.softmax_components == 1:
            self.projection = nn.Linear(output, embed, bias=False)
            nn.init.orthogonal_(self.projection.weight)
        self.mixture = None
        if config.softmax_components > 1:
            self.mixture = MixtureOfSoftmaxes(output, embed, config.softmax_components)
        self.output_embedding = None
        if not config.tie_embeddings:
            self.output_embedding = nn.Parameter(truncated_normal_(torch.empty(config.vocab_size, embed),
                                                                   math.sqrt(1.0 / embed)))
        self.output_bias = nn.Parameter(torch.zeros(config.vocab_size))

    def _recurrent_layers(self) -> list[RecurrentLayer]:
        return [RecurrentLayer(self.config, layer) for layer in range(self.config.num_layers)]

    def initial_state(self, batch_size: int) -> list[State]:
        device = self.output_bias.device
        zeros = [torch.zeros(batch_size, layer.cell.hidden_size, device=device) for layer in self.layers]
        return [(layer_zeros, layer_zeros) for layer_zeros in zeros]

    def take_last_layer_outputs(self) -> tuple[Tensor, Tensor] | None:
        """The last layer's outputs (time, batch, width) of the last training forward pass, before and after
        dropout, where the family regularises them (AR/TAR, trainers.objective), which the model then forgets
        (they hold the pass's graph); None otherwise."""
        return None

    def forward(self, tokens: Tensor, state: list[State]) -> tuple[Tensor, list[State]]:
        """Logits (time, batch, vocab) for a window of token ids (time, batch), and the next state.

        With a mixture of softmaxes the logits are log-probabilities.
        """
        config = self.config
        x = self._dropout(self._embed(tokens), config.input_dropout)
        outputs, next_state = [], []
        for index, (layer, layer_state) in enumerate(zip(self.layers, state, strict=True)):
            if index > 0:
                below = sum(outputs) if config.residual_connections else outputs[-1]
                x = self._dropout(below, config.inter_layer_dropout)
            state_mask = variational_mask(tokens.shape[1], config.hidden_size, self._rate(config.state_dropout), x)
            h, layer_state = run_layer(layer, x, layer_state, state_mask, self.cuda_graphs)
            outputs.append(self._dropout(h, config.cell_output_dropout))
            next_state.append(layer_state)
        return self._logits(self._dropout(sum(outputs), config.output_dropout)), next_state

    def _embed(self, tokens: Tensor) -> Tensor:
        """Embedding lookup; embedding dropout removes whole words (rows) for the whole window."""
        x = self.embedding(tokens)
        rate = self._rate(self.config.embedding_dropout)
        if rate > 0:
            keep = 1.0 - rate
            row_mask = torch.bernoulli(x.new_full((self.config.vocab_size,), keep)).div_(keep)
            x = x * row_mask[tokens].unsqueeze(-1)
        return x

    def _logits(self, output: Tensor) -> Tensor:
        softmax_weight = self.embedding.weight if self.output_embedding is None else self.output_embedding
        if self.mixture is not None:
            return self.mixture(output, softmax_weight, self.output_bias, self._rate(self.config.output_dropout))
        if self.projection is not None:
            output = self._dropout(self.projection(output), self.config.output_dropout)
        return nn.functional.linear(output, softmax_weight, self.output_bias)

    def _rate(self, rate: float) -> float:
        return rate * self.dropout_multiplier if self.training else 0.0

    def _dropout(self, x: Tensor, rate: float) -> Tensor:
        rate = self._rate(rate)
        return nn.functional.dropout(x, rate) if rate > 0 else x


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


def detach_state(state: list[tuple[Tensor, ...]]) -> list[tuple[Tensor, ...]]:
    """Cut the graph between windows (truncated BPTT) while carrying the values: each layer's state is a tuple of
    tensors, (h, c) for the LSTM families, (h,) for the GRU's (models/gru.py)."""
    return [tuple(tensor.detach() for tensor in layer_state) for layer_state in state]
