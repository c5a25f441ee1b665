"""The hyperparameters a study may fix or search, where each one goes, and what it may be."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lm_tuner.models import FAMILIES

MOGRIFIER_FAMILIES = tuple(family for family in FAMILIES if family.startswith("mogrifier"))


@dataclass(frozen=True)
class Hyperparameter:
    name: str
    target: Literal["model", "training"]
    kind: Literal["float", "int", "bool"]
    description: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # True: low itself is not allowed
    high_open: bool = False
    families: tuple[str, ...] = FAMILIES
    required: bool = False  # a study of one of `families` must fix or search it (no silent default)

    def allowed(self) -> str:
        if self.kind == "bool":
            return "true or false"
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        low = "-inf" if self.low is None else f"{self.low:g}"
        high = "inf" if self.high is None else f"{self.high:g}"
        kind = "an integer" if self.kind == "int" else "a number"
        return f"{kind} in {left}{low}, {high}{right}"

    def accepts(self, value: object) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind == "int" and not float(value).is_integer():
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.high_open and value == self.high))


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
                       "embedding size / hidden size; >= 1 means equal sizes", 0.0, None),
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
        Hyperparameter("mogrifier_rounds", "model", "int", "mogrifier rounds (0 = plain cell)", 0, 6,
                       families=MOGRIFIER_FAMILIES, required=True),
        Hyperparameter("mogrifier_rank", "model", "int", "rank of mogrifier matrices; <= 0 means full rank",
                       families=MOGRIFIER_FAMILIES, required=True),
    )
}
