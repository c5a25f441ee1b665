"""Recurrent language models (LSTM, Mogrifier LSTM, RLSTM, mLSTM, AWD-LSTM, GRU, Mogrifier GRU) and their budgets."""

from typing import Any

from lm_tuner.models.budget import count_parameters, count_parameters_by_building, solve_hidden_size
from lm_tuner.models.config import ModelConfig
from lm_tuner.models.families import Family, family, family_hyperparameters, family_names, register_family
from lm_tuner.models.hyperparameters import Hyperparameter
from lm_tuner.models.language_model import LanguageModel, detach_state, monte_carlo_dropout


def __getattr__(name: str) -> Any:
    """`FAMILIES`, the registered families' names in display order, read when asked so it includes plugins."""
    if name == "FAMILIES":
        return family_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FAMILIES",
    "Family",
    "Hyperparameter",
    "LanguageModel",
    "ModelConfig",
    "count_parameters",
    "count_parameters_by_building",
    "detach_state",
    "family",
    "family_hyperparameters",
    "family_names",
    "monte_carlo_dropout",
    "register_family",
    "solve_hidden_size",
]
