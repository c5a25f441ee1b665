"""The built-in families' parameter counts in closed form, from the layer shapes
(docs/methodology.md#equal-parameter-budgets).

Exact and cheap (no model is built), which the hidden-size solver needs: it counts dozens of shapes per trial.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lm_tuner.models.config import ModelConfig


def closed_form_parameter_count(config: ModelConfig) -> int:
    """The number of trainable parameters of `LanguageModel(config)` for a family running one of the built-in cells."""
    total = output_side_parameter_count(config, config.hidden_size)
    for layer in range(config.num_layers):
        inputs = config.layer_input_size(layer)
        total += cell_parameter_count(config.cell, inputs, config.hidden_size)
        total += _mogrifier_parameters(config, inputs)
    return total


def output_side_parameter_count(config: ModelConfig, output: int) -> int:
    """The embedding, the softmax, and what leads into it from a last layer `output` wide."""
    vocab, embed = config.vocab_size, config.embedding_size
    total = vocab * embed + vocab  # input embedding (shared with the softmax when tied) + softmax bias
    if not config.tie_embeddings:
        total += embed * vocab
    if output != embed and config.softmax_components == 1:  # a bias-free projection (a mixture has its own)
        total += output * embed
    if config.softmax_components > 1:  # tanh projections (with bias) and the prior (without)
        total += config.softmax_components * (output * embed + embed + output)
    return total


def cell_parameter_count(cell: str, inputs: int, hidden: int) -> int:
    """One built-in cell's weights and biases, reading `inputs` features into a state `hidden` wide."""
    if cell == "lstm":  # four gates from [x, h], biases
        return (inputs + hidden) * 4 * hidden + 4 * hidden
    if cell == "rlstm":  # i, j from [x, h]; f from [i*j, h]; o from c; biases
        return (inputs + hidden) * 2 * hidden + 2 * hidden * hidden + hidden * hidden + 4 * hidden
    if cell == "mlstm":  # m = (W_mx x) * (W_mh h); four gates from [x, m], biases
        return inputs * hidden + hidden * hidden + (inputs + hidden) * 4 * hidden + 4 * hidden
    if cell == "gru":  # r, z, n from x and from h, each side with its biases (nn.GRU's layout)
        return (inputs + hidden) * 3 * hidden + 6 * hidden
    raise ValueError(f"cell: got {cell!r}; allowed: lstm, rlstm, mlstm, gru (count other cells by building the model)")


def _mogrifier_parameters(config: ModelConfig, inputs: int) -> int:
    total = 0
    for round_index in range(config.mogrifier_rounds):
        gates_input = round_index % 2 == 0  # rounds 1, 3, 5 (1-based) gate x from h
        source, target = (config.hidden_size, inputs) if gates_input else (inputs, config.hidden_size)
        if config.mogrifier_rank <= 0:
            total += source * target + target
        else:
            total += config.mogrifier_rank * (source + target) + target
    return total
