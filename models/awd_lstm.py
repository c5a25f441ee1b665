"""AWD-LSTM (Merity, Keskar & Socher, 2018, "Regularizing and Optimizing LSTM Language Models";
docs/methodology.md#awd-lstm): LSTM layers of unequal sizes regularised by weight drop, locked dropout and AR/TAR.

What differs from `LanguageModel`:
- sizes (section 4.5): the first layer reads the embedding (E), the others read H; every layer is H wide except
  the last, which is E wide and feeds the (tied) softmax directly, without a projection;
- the output is the last layer's alone: no skip connections summing the layers (residual wiring of the inputs
  still works, since every layer below the last is H wide);
- weight drop (section 2): DropConnect on each layer's hidden-to-hidden matrix, one mask per window shared by
  every sequence, in training only;
- `input_dropout`, `inter_layer_dropout`, `cell_output_dropout` and `output_dropout` are locked (section 4.2): one
  mask per sequence for the whole window (embedding dropout, section 4.3, is every family's);
- the last layer's outputs of a training window, before and after dropout, are kept for AR and TAR (section 4.6),
  which the training objective adds (trainers/objective.py);
- initialisation (section 5, and the reference code's torch.nn.LSTM): embedding and untied softmax weights
  U(-0.1, 0.1), softmax bias 0, every weight of a layer h wide U(-1/sqrt(h), 1/sqrt(h)), each gate bias the sum of
  two such draws (torch's LSTM has two bias vectors where ours has their sum).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lm_tuner.models.closed_form import cell_parameter_count, output_side_parameter_count
from lm_tuner.models.config import ModelConfig
from lm_tuner.models.cuda_graphs import run_layer
from lm_tuner.models.initialisation import init_forget_bias_
from lm_tuner.models.language_model import LanguageModel
from lm_tuner.models.recurrence import RecurrentLayer, State, variational_mask

EMBEDDING_INIT_RANGE = 0.1
"""Embedding (and untied softmax) weights are drawn from U(-0.1, 0.1) (section 5; the reference's init_weights)."""


def layer_sizes(config: ModelConfig) -> list[tuple[int, int]]:
    """(input size, hidden size) of each layer: E -> H, H -> H, ..., H -> E (one layer alone: E -> E)."""
    embed, hidden, last = config.embedding_size, config.hidden_size, config.num_layers - 1
    return [(embed if layer == 0 else hidden, embed if layer == last else hidden) for layer in range(last + 1)]


def parameter_count(config: ModelConfig) -> int:
    """The trainable parameters of `AWDLanguageModel(config)` in closed form: the hidden-size solver counts dozens of
    shapes per trial, and building each model to count it took 6 ms (a study's plan, 6 s)."""
    sizes = layer_sizes(config)
    layers = sum(cell_parameter_count(config.cell, inputs, hidden) for inputs, hidden in sizes)
    return output_side_parameter_count(config, sizes[-1][1]) + layers


class AWDLanguageModel(LanguageModel):
    """The AWD-LSTM language model; `LanguageModel(config)` builds it for a family whose `model` names it."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self._kept_outputs: tuple[Tensor, Tensor] | None = None
        self._initialise_as_in_the_paper()

    def _recurrent_layers(self) -> list[RecurrentLayer]:
        return [RecurrentLayer(self.config, layer, sizes) for layer, sizes in enumerate(layer_sizes(self.config))]

    def _initialise_as_in_the_paper(self) -> None:
        with torch.no_grad():
            self.embedding.weight.uniform_(-EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE)
            if self.output_embedding is not None:
                self.output_embedding.uniform_(-EMBEDDING_INIT_RANGE, EMBEDDING_INIT_RANGE)
            for layer in self.layers:
                hidden = layer.cell.hidden_size
                bound = 1.0 / math.sqrt(hidden)
                for name, parameter in layer.cell.named_parameters():
                    parameter.uniform_(-bound, bound)
                    if name.endswith("bias"):
                        parameter.add_(torch.empty_like(parameter).uniform_(-bound, bound))
                if self.config.chrono_t_max > 0:
                    init_forget_bias_(layer.cell.input.bias[hidden : 2 * hidden], self.config.chrono_t_max)

    def forward(self, tokens: Tensor, state: list[State]) -> tuple[Tensor, list[State]]:
        """Logits (time, batch, vocab) for a window of token ids (time, batch), and the next state."""
        config = self.config
        x = self._locked_dropout(self._embed(tokens), config.input_dropout)
        outputs, next_state = [], []
        for index, (layer, layer_state) in enumerate(zip(self.layers, state, strict=True)):
            if index > 0:
                below = sum(outputs) if config.residual_connections else outputs[-1]
                x = self._locked_dropout(below, config.inter_layer_dropout)
            h, layer_state = self._run(layer, x, layer_state)
            outputs.append(self._locked_dropout(h, config.cell_output_dropout))
            next_state.append(layer_state)
        output = self._locked_dropout(outputs[-1], config.output_dropout)
        regularised = self.training and torch.is_grad_enabled() and (config.ar_alpha > 0 or config.tar_beta > 0)
        self._kept_outputs = (h, output) if regularised else None
        return self._logits(output), next_state

    def take_last_layer_outputs(self) -> tuple[Tensor, Tensor] | None:
        outputs, self._kept_outputs = self._kept_outputs, None
        return outputs

    def _run(self, layer: RecurrentLayer, x: Tensor, state: State) -> tuple[Tensor, State]:
        """The layer over the window; with weight drop its recurrent matrix is dropped once for the whole window.

        The weight-dropped window runs eagerly: a CUDA graph would replay the matrix it was captured with.
        """
        state_mask = variational_mask(x.shape[1], layer.cell.hidden_size, self._rate(self.config.state_dropout), x)
        rate = self._rate(self.config.weight_drop)
        if rate == 0:
            return run_layer(layer, x, state, state_mask, self.cuda_graphs)
        dropped = nn.functional.dropout(layer.cell.recurrent.weight, rate)
        return functional_call(layer, {"cell.recurrent.weight": dropped}, (x, state, state_mask))

    def _locked_dropout(self, x: Tensor, rate: float) -> Tensor:
        """Variational dropout of (time, batch, features): one mask per sequence, the same at every step."""
        mask = variational_mask(x.shape[1], x.shape[2], self._rate(rate), x)
        return x if mask is None else x * mask
