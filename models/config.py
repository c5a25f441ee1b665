"""Model configuration: plain data that fully determines a language model's shape."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lm_tuner.models import families


def __getattr__(name: str) -> Any:
    """`CELLS`, read from the registry when asked, so that it includes families registered later."""
    if name == "CELLS":  # the recurrent cell each family runs
        return {registered.name: registered.cell for registered in families.FAMILY_REGISTRY.values()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DROPOUT_RATES = (
    "input_dropout",
    "inter_layer_dropout",
    "cell_output_dropout",
    "state_dropout",
    "output_dropout",
    "embedding_dropout",
)


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build (or count the parameters of) a recurrent language model.

    `input_embedding_ratio` >= 1 means the embedding size equals the hidden size; below 1 the
    embedding is smaller and a bias-free projection maps the summed hidden state to it before the
    tied softmax. `mogrifier_rank` <= 0 means full-rank mogrifier matrices. Layers are combined by
    skip connections (each layer reads the one below, the output sums all layers) unless
    `residual_connections`, where each layer reads the sum of all layers below it.
    `chrono_t_max` > 0 draws forget biases from ln U(1, T_max - 1) (chrono init) instead of mean 1.
    `softmax_components` > 1 replaces the softmax by a mixture of that many softmaxes.
    `weight_drop`, `ar_alpha` and `tar_beta` are AWD-LSTM's regularisers (Merity et al. 2018, sections 2 and 4.6):
    DropConnect on the recurrent matrices, and the coefficients of the activation penalties the training objective
    adds; they are 0 for the families that do not declare them. `options` holds the values of a family's own
    hyperparameters that are not fields here (a plugin family's), as sorted (name, value) pairs; `option(name)`
    reads one, or the family's default.
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
    residual_connections: bool = False
    softmax_components: int = 1
    chrono_t_max: float = 0.0
    input_dropout: float = 0.0
    inter_layer_dropout: float = 0.0
    cell_output_dropout: float = 0.0
    state_dropout: float = 0.0
    output_dropout: float = 0.0
    embedding_dropout: float = 0.0
    weight_drop: float = 0.0
    ar_alpha: float = 0.0
    tar_beta: float = 0.0
    options: tuple[tuple[str, bool | int | float], ...] = ()

    def __post_init__(self) -> None:
        configured = families.family(self.family)
        _require(self.vocab_size >= 1, "vocab_size", self.vocab_size, "an integer >= 1")
        _require(self.hidden_size >= 1, "hidden_size", self.hidden_size, "an integer >= 1")
        _require(self.num_layers >= 1, "num_layers", self.num_layers, "an integer >= 1")
        _require(self.input_embedding_ratio >= 0, "input_embedding_ratio", self.input_embedding_ratio,
                 "a number >= 0 (the embedding has at least 1 dimension)")
        _require(0 <= self.mogrifier_rounds <= 6, "mogrifier_rounds", self.mogrifier_rounds, "an integer in [0, 6]")
        if not configured.mogrifier:
            with_mogrifier = " or ".join(repr(f.name) for f in families.FAMILY_REGISTRY.values() if f.mogrifier)
            _require(self.mogrifier_rounds == 0, "mogrifier_rounds", self.mogrifier_rounds,
                     f"0 for family {self.family!r} (use family {with_mogrifier})")
        _require(self.softmax_components >= 1, "softmax_components", self.softmax_components, "an integer >= 1")
        _require(self.chrono_t_max == 0 or self.chrono_t_max > 2, "chrono_t_max", self.chrono_t_max,
                 "0 (forget bias mean 1) or a number > 2")
        for name in DROPOUT_RATES:
            rate = getattr(self, name)
            _require(0.0 <= rate < 1.0, name, rate, "a rate in [0, 1)")
        _require(0.0 <= self.weight_drop < 1.0, "weight_drop", self.weight_drop, "a rate in [0, 1)")
        _require(self.ar_alpha >= 0, "ar_alpha", self.ar_alpha, "a number >= 0")
        _require(self.tar_beta >= 0, "tar_beta", self.tar_beta, "a number >= 0")
        declared = {hyper.name for hyper in configured.hyperparameters}
        for name in (hyper.name for hyper in families.AWD_LSTM_HYPERPARAMETERS):
            if name not in declared:
                owners = " or ".join(repr(f.name) for f in families.FAMILY_REGISTRY.values()
                                     if name in {hyper.name for hyper in f.hyperparameters})
                _require(getattr(self, name) == 0, name, getattr(self, name),
                         f"0 for family {self.family!r} (use family {owners})")
        object.__setattr__(self, "options", tuple(sorted((str(name), value) for name, value in self.options)))
        own = {hyper.name: hyper for hyper in configured.hyperparameters if hyper.name not in _FIELDS}
        for name, value in self.options:
            _require(name in own, "options", name, f"a hyperparameter of family {self.family!r} that is not a "
                                                   f"ModelConfig field ({', '.join(sorted(own)) or 'none'})")
            _require(own[name].accepts(value), name, value, f"{own[name].allowed()} (family {self.family!r})")

    def option(self, name: str) -> bool | int | float:
        """The value of the family's own hyperparameter `name`: the configured one, else the family's default."""
        return dict(self.options).get(name, families.family(self.family).defaults[name])

    @property
    def cell(self) -> str:
        return families.family(self.family).cell

    @property
    def embedding_size(self) -> int:
        return max(1, round(min(self.input_embedding_ratio, 1.0) * self.hidden_size))

    def layer_input_size(self, layer: int) -> int:
        return self.embedding_size if layer == 0 else self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """The inverse of `to_dict`, also of its JSON form (where `options` became lists)."""
        return cls(**{**data, "options": tuple(tuple(pair) for pair in data.get("options", ()))})


_FIELDS = frozenset(ModelConfig.__dataclass_fields__)


def _require(ok: bool, field: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{field}: got {value!r}; allowed: {allowed}")
