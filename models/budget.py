"""Parameter budgets: count trainable parameters from a configuration, and solve for hidden size.

Models are compared at equal trainable-parameter counts, so the count must be exact. A family's closed form
(`Family.parameter_count`, models/closed_form.py for the built-in ones) is exact and cheap; a family without one
is counted on a model built on the meta device, which has shapes but no storage and runs no initialisation.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from lm_tuner.models.config import ModelConfig
from lm_tuner.models.families import family
from lm_tuner.models.language_model import LanguageModel


def count_parameters(config: ModelConfig) -> int:
    """The number of trainable parameters of `LanguageModel(config)`: the family's closed form where it has one."""
    closed_form = family(config.family).parameter_count
    return count_parameters_by_building(config) if closed_form is None else closed_form(config)


def count_parameters_by_building(config: ModelConfig) -> int:
    """The number of trainable parameters of `LanguageModel(config)`, built on the meta device to count them."""
    with torch.device("meta"):
        model = LanguageModel(config)
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


def solve_hidden_size(config: ModelConfig, budget: int) -> ModelConfig:
    """The configuration with the largest hidden size whose parameter count is within `budget`.

    Every field but `hidden_size` is taken from `config`. Raises ValueError when even a hidden size
    of 1 exceeds the budget.
    """
    smallest = count_parameters(replace(config, hidden_size=1))
    if smallest > budget:
        raise ValueError(
            f"parameter_budget: {budget:,} is too small for vocabulary {config.vocab_size:,} "
            f"and {config.num_layers} layer(s); the smallest model has {smallest:,} parameters"
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
