"""Parameter budgets: count trainable parameters from a configuration, and solve for hidden size.

Models are compared at equal trainable-parameter counts, so the count must be exact and cheap:
it is derived from the layer shapes in closed form and never builds a model.
"""

from __future__ import annotations

from dataclasses import replace

from lm_tuner.models.config import ModelConfig


def count_parameters(config: ModelConfig) -> int:
    """The number of trainable parameters of `LanguageModel(config)`."""
    vocab, embed, hidden = config.vocab_size, config.embedding_size, config.hidden_size
    total = vocab * embed + vocab  # input embedding (shared with the softmax when tied) + softmax bias
    if not config.tie_embeddings:
        total += embed * vocab
    if config.has_projection:
        total += hidden * embed
    if config.softmax_components > 1:  # tanh projections (with bias) and the prior (without)
        total += config.softmax_components * (hidden * embed + embed + hidden)
    for layer in range(config.num_layers):
        inputs = config.layer_input_size(layer)
        total += _cell_parameters(config.cell, inputs, hidden)
        total += _mogrifier_parameters(config, inputs)
    return total


def _cell_parameters(cell: str, inputs: int, hidden: int) -> int:
    if cell == "lstm":  # four gates from [x, h], biases
        return (inputs + hidden) * 4 * hidden + 4 * hidden
    if cell == "rlstm":  # i, j from [x, h]; f from [i*j, h]; o from c; biases
        return (inputs + hidden) * 2 * hidden + 2 * hidden * hidden + hidden * hidden + 4 * hidden
    # mlstm: m = (W_mx x) * (W_mh h); four gates from [x, m], biases
    return inputs * hidden + hidden * hidden + (inputs + hidden) * 4 * hidden + 4 * hidden


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


def solve_hidden_size(config: ModelConfig, budget: int) -> ModelConfig:
    """The configuration with the largest hidden size whose parameter count is within `budget`.

    Every field but `hidden_size` is taken from `config`. Raises ValueError when even a hidden size
    of 1 exceeds the budget.
    """
    if count_parameters(replace(config, hidden_size=1)) > budget:
        raise ValueError(
            f"parameter_budget: {budget:,} is too small for vocabulary {config.vocab_size:,} "
            f"and {config.num_layers} layer(s); the smallest model has "
            f"{count_parameters(replace(config, hidden_size=1)):,} parameters"
        )
    low, high = 1, 2
    while count_parameters(replace(config, hidden_size=high)) <= budget:
        low, high = high, high * 2
    while high - low > 1:  # invariant: count(low) <= budget < count(high); count grows with H
        middle = (low + high) // 2
        if count_parameters(replace(config, hidden_size=middle)) <= budget:
            low = middle
        else:
            high = middle
    return replace(config, hidden_size=low)
