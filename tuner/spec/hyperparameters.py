"""The hyperparameters a study may fix or search, where each one goes, and what it may be."""

from __future__ import annotations

from lm_tuner.models import family_hyperparameters, family_names
from lm_tuner.models.hyperparameters import Hyperparameter


def _rate(name: str, description: str) -> Hyperparameter:
    return Hyperparameter(name, "model", "float", description, 0.0, 1.0, high_open=True)


HYPERPARAMETERS: dict[str, Hyperparameter] = {
    h.name: h
    for h in (
        Hyperparameter("learning_rate", "training", "float", "Adam learning rate", 0.0, None, low_open=True),
        Hyperparameter("l2_penalty", "training", "float", "L2 coefficient (l2 * sum(theta^2) / 2)", 0.0),
        Hyperparameter("num_layers", "model", "int", "recurrent layers", 1, 16),
        Hyperparameter("tie_embeddings", "model", "bool", "share input and output embeddings (word level)"),
        Hyperparameter("input_embedding_ratio", "model", "float",
                       "embedding size / hidden size; >= 1 means equal sizes (residual families: 1 only)", 0.0,
                       None),
        Hyperparameter("cap_input_gate", "model", "bool", "use min(i, 1 - f) as the input gate"),
        Hyperparameter("residual_connections", "model", "bool",
                       "each layer reads the sum of all layers below (else only the one below)"),
        Hyperparameter("softmax_components", "model", "int", "mixture of softmaxes components (1 = one softmax)", 1),
        Hyperparameter("chrono_t_max", "model", "float",
                       "chrono forget-gate init b_f ~ ln U(1, T_max - 1) (> 2); 0 = forget bias mean 1", 0.0),
        _rate("input_dropout", "dropout on the embedding output"),
        _rate("embedding_dropout", "drops whole words (embedding rows) for a window"),
        _rate("inter_layer_dropout", "dropout on the inputs of layers above the first"),
        _rate("cell_output_dropout", "dropout on each layer's output before it joins the sums"),
        _rate("state_dropout", "variational dropout on h_prev, one mask per sequence per window"),
        _rate("output_dropout", "dropout on the summed output (and after the projection)"),
    )
} | {name: hyper for name, (hyper, _families) in family_hyperparameters().items()}
"""Every hyperparameter a study may set: the ones every family has, then each family's own (models.families)."""


def families_of(hyper: Hyperparameter) -> tuple[str, ...]:
    """The registered families `hyper` applies to."""
    return tuple(name for name in family_names() if hyper.applies_to(name))
