"""Model configuration: plain data that fully determines a language model's shape."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

FAMILIES = ("lstm", "mogrifier")
"""Cell families this package can build. `mogrifier` is the LSTM preceded by a mogrifier."""


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build (or count the parameters of) a recurrent language model.

    `input_embedding_ratio` >= 1 means the embedding size equals the hidden size; below 1 the
    embedding is smaller and a bias-free projection maps the summed hidden state to it before the
    tied softmax. `mogrifier_rank` <= 0 means full-rank mogrifier matrices.
    """

    vocab_size: int
    hidden_size: int
    family: str = "lstm"
    num_layers: int = 2
    input_embedding_ratio: float = 1.0
    mogrifier_rounds: int = 0
    mogrifier_rank: int = 0
    cap_input_gate: bool = True
    tie_embeddings: bool = True
    input_dropout: float = 0.0
    inter_layer_dropout: float = 0.0
    state_dropout: float = 0.0
    output_dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family: unknown family {self.family!r}; allowed: {', '.join(FAMILIES)}")
        _require(self.vocab_size >= 1, "vocab_size", self.vocab_size, "an integer >= 1")
        _require(self.hidden_size >= 1, "hidden_size", self.hidden_size, "an integer >= 1")
        _require(self.num_layers >= 1, "num_layers", self.num_layers, "an integer >= 1")
        _require(self.input_embedding_ratio > 0, "input_embedding_ratio", self.input_embedding_ratio, "a number > 0")
        _require(0 <= self.mogrifier_rounds <= 6, "mogrifier_rounds", self.mogrifier_rounds, "an integer in [0, 6]")
        if self.family == "lstm":
            _require(self.mogrifier_rounds == 0, "mogrifier_rounds", self.mogrifier_rounds,
                     "0 for family 'lstm' (use family 'mogrifier')")
        for name in ("input_dropout", "inter_layer_dropout", "state_dropout", "output_dropout"):
            rate = getattr(self, name)
            _require(0.0 <= rate < 1.0, name, rate, "a rate in [0, 1)")

    @property
    def embedding_size(self) -> int:
        return max(1, round(min(self.input_embedding_ratio, 1.0) * self.hidden_size))

    @property
    def has_projection(self) -> bool:
        return self.embedding_size != self.hidden_size

    def layer_input_size(self, layer: int) -> int:
        return self.embedding_size if layer == 0 else self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        return cls(**data)


def _require(ok: bool, field: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{field}: got {value!r}; allowed: {allowed}")
