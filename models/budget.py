"""Parameter budgets: count trainable parameters from a configuration (in all and by part), and solve for hidden size.

Models are compared at equal trainable-parameter counts, so the count must be exact. A family's closed form
(`Family.parameter_count`, models/closed_form.py for the built-in ones) is exact and cheap; a family without one
is counted on a model built on the meta device, which has shapes but no storage and runs no initialisation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from lm_tuner.models.config import ModelConfig
from lm_tuner.models.families import family
from lm_tuner.models.language_model import LanguageModel


def count_parameters(config: ModelConfig) -> int:
    """The number of trainable parameters of `LanguageModel(config)`: the family's closed form where it has one."""
    closed_form = family(config.family).parameter_count
    return count_parameters_by_building(config) if closed_form is None else closed_form(config)


def count_parameters_by_building(config: ModelConfig) -> int:
    """The number of trainable parameters of `LanguageModel(config)`, built on the meta device to count them."""
    with shapes_only():
        model = LanguageModel(config)
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


class _NoInitialisation(TorchFunctionMode):
    """Initialisations (torch.nn.init's in-place functions, and the random fills models call themselves) return their
    tensor untouched. On the meta device they have nothing to write, yet the first one (`normal_`, through torch's
    Python references) imports torch._dynamo, and Triton with it: 1.5-3 s on 2 cores."""

    RANDOM_FILLS = frozenset({torch.Tensor.normal_, torch.Tensor.uniform_})

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        initialiser = getattr(func, "__module__", None) == "torch.nn.init" and func.__name__.endswith("_")
        if initialiser or func in self.RANDOM_FILLS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


@contextmanager
def shapes_only() -> Iterator[None]:
    """Models built here have their parameters' shapes only: no storage, no initialisation."""
    with torch.device("meta"), _NoInitialisation():
        yield


PARAMETER_PARTS = {"embedding": "embedding", "layers": "recurrent", "projection": "softmax", "mixture": "softmax",
                   "output_embedding": "softmax", "output_bias": "softmax"}
"""Where each top-level part of `LanguageModel` counts: the (tied) embedding, the recurrent layers, or the softmax
with what leads into it (projection, mixture of softmaxes, an untied output embedding, the bias)."""


def parameter_breakdown(config: ModelConfig) -> dict[str, int]:
    """Trainable parameters of `LanguageModel(config)` by part: embedding, recurrent, softmax, and their total.

    A tied embedding also serves as the softmax's weights; it counts once, as embedding.
    """
    with shapes_only():
        model = LanguageModel(config)
    parts = dict.fromkeys(("embedding", "recurrent", "softmax"), 0)
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            parts[PARAMETER_PARTS[name.split(".")[0]]] += parameter.numel()
    return {**parts, "total": sum(parts.values())}


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
