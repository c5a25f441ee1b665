"""Recurrent language models (LSTM, Mogrifier LSTM, RLSTM, mLSTM) and their parameter budgets."""

from lm_tuner.models.budget import count_parameters, solve_hidden_size
from lm_tuner.models.config import FAMILIES, ModelConfig
from lm_tuner.models.language_model import LanguageModel, detach_state, monte_carlo_dropout

__all__ = [
    "FAMILIES",
    "LanguageModel",
    "ModelConfig",
    "count_parameters",
    "detach_state",
    "monte_carlo_dropout",
    "solve_hidden_size",
]
