"""The model families: the cell each runs, what it puts around the cell, its paper and its own hyperparameters.

The registry is the one list of families: `ModelConfig` validates against it, the budget solver counts with it,
and the tuner builds its catalogue of hyperparameters from it. Its order is the display order: the built-in families,
then those of plugins (entry points in the group `lm_tuner.families`, models/plugins.py), which are loaded when
`family`, `family_names` or `family_hyperparameters` is first called. A plugin family that failed to load is
not listed; asking for it by name raises its `FamilyPluginError` (docs/families.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from lm_tuner.models.cells import CELLS
from lm_tuner.models.closed_form import closed_form_parameter_count
from lm_tuner.models.hyperparameters import Hyperparameter

if TYPE_CHECKING:
    from lm_tuner.models.config import ModelConfig
    from lm_tuner.models.language_model import LanguageModel
    from lm_tuner.models.plugins import FamilyPluginError


@dataclass(frozen=True)
class Family:
    """A model family: `cell` (a key of models.cells.CELLS), with a mogrifier in front of it when `mogrifier`.

    `residual`: the family's paper uses the residual architecture (Melis thesis, ch. 4), which assumes embedding
    size == hidden size; it describes the family, while a model's layers are wired by
    `ModelConfig.residual_connections`. `hyperparameters` are the ones only some families have (their `families`
    left None); `defaults` gives each of them the value a model of this family has when a study sets none.
    `parameter_count` is an exact closed form of the trainable-parameter count; None counts a model built on the
    meta device instead (models/budget.py), which is exact for any family but slower. `model` returns the
    `LanguageModel` subclass that builds this family's models (None: `LanguageModel` itself); it is a function so
    that the registry need not import the models, which import it.
    """

    name: str
    cell: str
    mogrifier: bool
    residual: bool
    paper: str
    description: str
    hyperparameters: tuple[Hyperparameter, ...] = ()
    defaults: Mapping[str, object] = field(default_factory=dict, hash=False)
    parameter_count: Callable[[ModelConfig], int] | None = None
    model: Callable[[], type[LanguageModel]] | None = None

    def __post_init__(self) -> None:
        if self.cell not in CELLS:
            raise ValueError(f"cell: got {self.cell!r} for family {self.name!r}; allowed: {', '.join(CELLS)}")
        names = [hyper.name for hyper in self.hyperparameters]
        if duplicates := sorted(name for name, count in Counter(names).items() if count > 1):
            raise ValueError(f"hyperparameters: family {self.name!r} declares {', '.join(duplicates)} twice")
        if claimed := [hyper.name for hyper in self.hyperparameters if hyper.families is not None]:
            raise ValueError(f"hyperparameters: {', '.join(claimed)} of family {self.name!r} name families; "
                             f"allowed: families=None (the registry fills in the families that declare it)")
        if set(self.defaults) != set(names):
            raise ValueError(f"defaults: got {', '.join(self.defaults) or '(none)'} for family {self.name!r}; "
                             f"allowed: exactly its hyperparameters ({', '.join(names) or 'none'})")
        for hyper in self.hyperparameters:
            if not hyper.accepts(self.defaults[hyper.name]):
                raise ValueError(f"defaults: {hyper.name} of family {self.name!r} is "
                                 f"{self.defaults[hyper.name]!r}; allowed: {hyper.allowed()}")
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))


MOGRIFIER_HYPERPARAMETERS = (
    Hyperparameter("mogrifier_rounds", "model", "int", "mogrifier rounds (0 = plain cell)", 0, 6, required=True),
    Hyperparameter("mogrifier_rank", "model", "int", "rank of mogrifier matrices; <= 0 means full rank",
                   required=True),
)
"""The hyperparameters of every family with a mogrifier."""

MOGRIFIER_DEFAULTS = MappingProxyType({"mogrifier_rounds": 0, "mogrifier_rank": 0})

MOGRIFIER_PAPER = "Melis, Kočiský & Blunsom (2020), Mogrifier LSTM, ICLR"
RLSTM_PAPER = "Melis (2023), Towards Better Generative Models of Language, PhD thesis, UCL, ch. 4"

AWD_LSTM_HYPERPARAMETERS = (
    Hyperparameter("weight_drop", "model", "float", "DropConnect on the hidden-to-hidden matrices, one mask per "
                   "window", 0.0, 1.0, high_open=True, required=True),
    Hyperparameter("ar_alpha", "model", "float", "activation regularisation: alpha x mean square of the last "
                   "layer's dropped-out outputs", 0.0, required=True),
    Hyperparameter("tar_beta", "model", "float", "temporal activation regularisation: beta x mean square of the "
                   "last layer's step-to-step output changes", 0.0, required=True),
)
"""The regularisers of AWD-LSTM (Merity, Keskar & Socher, 2018, sections 2 and 4.6); 0 turns each off, and a model
of a family that does not declare them has them at 0 (`ModelConfig` checks)."""

AWD_LSTM_DEFAULTS = MappingProxyType({hyper.name: 0.0 for hyper in AWD_LSTM_HYPERPARAMETERS})


GRU_PAPER = ("Cho, van Merriënboer, Gulcehre, Bahdanau, Bougares, Schwenk & Bengio (2014), Learning Phrase "
             "Representations using RNN Encoder-Decoder for Statistical Machine Translation, EMNLP")


def _gru_model() -> type[LanguageModel]:
    from lm_tuner.models.gru import GRULanguageModel  # here, not above: that module imports this one

    return GRULanguageModel


def _awd_lstm_model() -> type[LanguageModel]:
    from lm_tuner.models.awd_lstm import AWDLanguageModel  # here, not above: that module imports this one

    return AWDLanguageModel


def _awd_lstm_parameter_count(config: ModelConfig) -> int:
    from lm_tuner.models.awd_lstm import parameter_count  # here, not above: that module imports this one

    return parameter_count(config)


TRANSFORMER_PAPER = ("Vaswani, Shazeer, Parmar, Uszkoreit, Jones, Gomez, Kaiser & Polosukhin (2017), Attention Is "
                     "All You Need, NeurIPS; pre-LayerNorm: Xiong, Yang, He, Zheng, Zheng, Xing, Zhang, Lan, Wang & "
                     "Liu (2020), On Layer Normalization in the Transformer Architecture, ICML; rotary positions: "
                     "Su, Lu, Pan, Murtadha, Wen & Liu (2021), RoFormer: Enhanced Transformer with Rotary Position "
                     "Embedding, arXiv:2104.09864")

TRANSFORMER_HYPERPARAMETERS = (
    Hyperparameter("attention_heads", "model", "int", "attention heads per block (Vaswani et al. 2017, section "
                   "3.2.2); the solved width is a multiple of it (of twice it with rotary positions)", 1, 64),
    Hyperparameter("rotary_positions", "model", "bool", "true: rotary positions in every attention (Su et al. "
                   "2021); false: learned positions added to the embedded tokens (Vaswani et al. 2017, section 3.5)"),
    Hyperparameter("context_length", "model", "int", "tokens a prediction may attend to, the current one included; "
                   "set it to the training bptt (docs/families.md#transformer)", 1, 4096, required=True),
)
"""The Transformer's own hyperparameters; its depth is `num_layers`, its width is solved from the budget."""

TRANSFORMER_DEFAULTS = MappingProxyType({"attention_heads": 4, "rotary_positions": True, "context_length": 70})
"""A model built outside a study: 4 heads, rotary positions, the 70-token context of the PTB word-level bptt."""


def _transformer_model() -> type[LanguageModel]:
    from lm_tuner.models.transformer import TransformerLanguageModel  # here, not above: that module imports this one

    return TransformerLanguageModel


def _transformer_parameter_count(config: ModelConfig) -> int:
    from lm_tuner.models.transformer import parameter_count  # here, not above: that module imports this one

    return parameter_count(config)


FAMILY_REGISTRY: dict[str, Family] = {}
"""Every family by name, in display order. Add to it with `register_family` only."""


def register_family(family: Family) -> Family:
    """Adds `family` to the registry (after the others). Refuses a name already taken, and a hyperparameter
    whose definition differs from that of another family declaring the same name."""
    if family.name in FAMILY_REGISTRY:
        raise ValueError(f"family: {family.name!r} is already registered; choose another name "
                         f"(taken: {', '.join(FAMILY_REGISTRY)})")
    declared = {hyper.name: (hyper, owner) for owner in FAMILY_REGISTRY.values() for hyper in owner.hyperparameters}
    for hyper in family.hyperparameters:
        if hyper.name in declared and declared[hyper.name][0] != hyper:
            raise ValueError(f"hyperparameters: {hyper.name!r} of family {family.name!r} differs from the one family "
                             f"{declared[hyper.name][1].name!r} declares; allowed: the same definition")
    FAMILY_REGISTRY[family.name] = family
    return family


_plugin_errors: dict[str, FamilyPluginError] | None = None
"""The error of each plugin that failed to load, by entry-point name; None until the plugins are loaded."""


def _load_plugins() -> dict[str, FamilyPluginError]:
    global _plugin_errors
    if _plugin_errors is None:
        _plugin_errors = {}  # before loading: a plugin that asks the registry while it loads must not load again
        from lm_tuner.models.plugins import load_family_plugins  # here: that module imports this one

        _plugin_errors.update(load_family_plugins(register_family))
    return _plugin_errors


def family_plugin_error(name: str) -> FamilyPluginError | None:
    """The error of the family plugin whose entry point is called `name`, where it failed to load and no family of
    that name is registered; None otherwise."""
    errors = _load_plugins()
    return None if name in FAMILY_REGISTRY else errors.get(name)


def family(name: str) -> Family:
    """The registered family called `name`; for a plugin family that failed to load, its `FamilyPluginError`."""
    if (plugin_error := family_plugin_error(name)) is not None:
        raise plugin_error
    if name not in FAMILY_REGISTRY:
        raise ValueError(f"family: got {name!r}; allowed: {', '.join(FAMILY_REGISTRY)}")
    return FAMILY_REGISTRY[name]


def family_names() -> tuple[str, ...]:
    """The registered families' names, in display order."""
    _load_plugins()
    return tuple(FAMILY_REGISTRY)


def family_hyperparameters() -> dict[str, tuple[Hyperparameter, tuple[str, ...]]]:
    """Each hyperparameter that only some families have: its definition, with `families` set to the families that
    declare it (in display order), and those families."""
    _load_plugins()
    owners: dict[str, list[str]] = {}
    definitions: dict[str, Hyperparameter] = {}
    for registered in FAMILY_REGISTRY.values():
        for hyper in registered.hyperparameters:
            definitions.setdefault(hyper.name, hyper)
            owners.setdefault(hyper.name, []).append(registered.name)
    return {name: (replace(definitions[name], families=tuple(owners[name])), tuple(owners[name]))
            for name in definitions}


BUILT_IN_FAMILIES = (
    Family("lstm", cell="lstm", mogrifier=False, residual=False,
           paper="Hochreiter & Schmidhuber (1997), Long Short-Term Memory, Neural Computation",
           description="the LSTM, by default with the input gate capped at 1 - f: the baseline",
           parameter_count=closed_form_parameter_count),
    Family("mogrifier", cell="lstm", mogrifier=True, residual=False, paper=MOGRIFIER_PAPER,
           description="rounds of mutual gating of the input and the previous state, then the LSTM",
           hyperparameters=MOGRIFIER_HYPERPARAMETERS, defaults=MOGRIFIER_DEFAULTS,
           parameter_count=closed_form_parameter_count),
    Family("rlstm", cell="rlstm", mogrifier=False, residual=True, paper=RLSTM_PAPER,
           description="the Rewired LSTM: the forget gate reads i * j, the output gate reads c",
           parameter_count=closed_form_parameter_count),
    Family("mogrifier_rlstm", cell="rlstm", mogrifier=True, residual=True, paper=RLSTM_PAPER,
           description="the mogrifier's rounds, then the Rewired LSTM",
           hyperparameters=MOGRIFIER_HYPERPARAMETERS, defaults=MOGRIFIER_DEFAULTS,
           parameter_count=closed_form_parameter_count),
    Family("mlstm", cell="mlstm", mogrifier=False, residual=False,
           paper="Krause, Lu, Murray & Renals (2016), Multiplicative LSTM for sequence modelling, arXiv:1609.07959",
           description="the multiplicative LSTM: m = (W_mx x) * (W_mh h) replaces h in every gate",
           parameter_count=closed_form_parameter_count),
    Family("awd_lstm", cell="lstm", mogrifier=False, residual=False,
           paper="Merity, Keskar & Socher (2018), Regularizing and Optimizing LSTM Language Models, ICLR",
           description="AWD-LSTM: LSTM layers of unequal sizes, the last as wide as the embedding, with weight drop, "
                       "locked dropout and AR/TAR",
           hyperparameters=AWD_LSTM_HYPERPARAMETERS, defaults=AWD_LSTM_DEFAULTS,
           parameter_count=_awd_lstm_parameter_count, model=_awd_lstm_model),
    Family("gru", cell="gru", mogrifier=False, residual=False, paper=GRU_PAPER,
           description="the GRU: reset and update gates, state h alone; PyTorch's fused nn.GRU without state dropout",
           parameter_count=closed_form_parameter_count, model=_gru_model),
    Family("mogrifier_gru", cell="gru", mogrifier=True, residual=False,
           paper=f"{MOGRIFIER_PAPER}, section 7 (the GRU as future work); {GRU_PAPER}",
           description="the mogrifier's rounds, then a GRU update whose gates read the mogrified x and h",
           hyperparameters=MOGRIFIER_HYPERPARAMETERS, defaults=MOGRIFIER_DEFAULTS,
           parameter_count=closed_form_parameter_count, model=_gru_model),
    Family("transformer", cell="transformer", mogrifier=False, residual=False, paper=TRANSFORMER_PAPER,
           description="a decoder-only pre-LayerNorm Transformer reading each window causally, with learned or rotary "
                       "positions; dropout: embedding_dropout whole words, input_dropout the embedded tokens, "
                       "state_dropout the attention weights, inter_layer_dropout each residual branch, "
                       "cell_output_dropout the feed-forward activations, output_dropout the output",
           hyperparameters=TRANSFORMER_HYPERPARAMETERS, defaults=TRANSFORMER_DEFAULTS,
           parameter_count=_transformer_parameter_count, model=_transformer_model),
)
for built_in in BUILT_IN_FAMILIES:
    register_family(built_in)
