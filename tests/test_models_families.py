"""The family registry, and the budget counted without a closed form: a model built on the meta device."""

import itertools
from dataclasses import replace

import pytest

from lm_tuner import models
from lm_tuner.models import (
    FAMILIES,
    Family,
    Hyperparameter,
    ModelConfig,
    count_parameters,
    count_parameters_by_building,
    family,
    family_hyperparameters,
    family_names,
    register_family,
    solve_hidden_size,
)
from lm_tuner.models.cells import CELLS as CELL_MODULES
from lm_tuner.models.config import CELLS
from lm_tuner.models.families import FAMILY_REGISTRY

BUILT_IN = ("lstm", "mogrifier", "rlstm", "mogrifier_rlstm", "mlstm", "awd_lstm", "gru", "mogrifier_gru", "transformer")
CLOSED_FORM = ("lstm", "mogrifier", "rlstm", "mogrifier_rlstm", "mlstm", "awd_lstm", "gru", "mogrifier_gru")
"""The recurrent families' closed forms; the transformer's (its width must suit its heads) is checked in
tests/test_models_transformer.py."""


@pytest.fixture
def register():
    """`register_family` whose families leave the registry again after the test."""
    added = []

    def add(new: Family) -> Family:
        added.append(register_family(new).name)
        return new

    yield add
    for name in added:
        del FAMILY_REGISTRY[name]


def test_the_registry_lists_the_built_in_families_in_display_order():
    assert family_names() == FAMILIES == tuple(FAMILY_REGISTRY) == BUILT_IN
    assert CELLS == {"lstm": "lstm", "mogrifier": "lstm", "rlstm": "rlstm", "mogrifier_rlstm": "rlstm",
                     "mlstm": "mlstm", "awd_lstm": "lstm", "gru": "gru", "mogrifier_gru": "gru",
                     "transformer": "transformer"}
    assert [name for name in BUILT_IN if family(name).mogrifier] == ["mogrifier", "mogrifier_rlstm", "mogrifier_gru"]
    assert [name for name in BUILT_IN if family(name).residual] == ["rlstm", "mogrifier_rlstm"]
    assert all(family(name).cell in CELL_MODULES and family(name).paper for name in BUILT_IN)
    assert all(family(name).parameter_count is not None for name in BUILT_IN)  # none built to be counted
    assert [name for name in BUILT_IN if family(name).model is not None] == ["awd_lstm", "gru", "mogrifier_gru",
                                                                                    "transformer"]


def test_an_unknown_family_is_refused_with_the_allowed_names():
    with pytest.raises(ValueError, match=r"family: got 'elman'; allowed: lstm, mogrifier, rlstm, mogrifier_rlstm, ml"):
        family("elman")


def test_family_hyperparameters_name_the_families_that_declare_them():
    catalogue = family_hyperparameters()
    assert set(catalogue) == {"mogrifier_rounds", "mogrifier_rank", "weight_drop", "ar_alpha", "tar_beta",
                              "attention_heads", "rotary_positions", "context_length"}
    rounds, owners = catalogue["mogrifier_rounds"]
    assert owners == rounds.families == ("mogrifier", "mogrifier_rlstm", "mogrifier_gru")
    assert (rounds.kind, rounds.low, rounds.high, rounds.required) == ("int", 0, 6, True)
    assert rounds.applies_to("mogrifier") and not rounds.applies_to("lstm")
    assert catalogue["mogrifier_rank"][0].description == "rank of mogrifier matrices; <= 0 means full rank"
    assert dict(family("mogrifier").defaults) == {"mogrifier_rounds": 0, "mogrifier_rank": 0}
    assert family("lstm").hyperparameters == () and dict(family("lstm").defaults) == {}
    weight_drop, owners = catalogue["weight_drop"]
    assert owners == ("awd_lstm",) and (weight_drop.low, weight_drop.high, weight_drop.high_open) == (0, 1, True)
    assert dict(family("awd_lstm").defaults) == {"weight_drop": 0.0, "ar_alpha": 0.0, "tar_beta": 0.0}


def test_a_hyperparameter_without_families_applies_to_every_family_even_a_later_one():
    hyper = Hyperparameter("num_layers", "model", "int", "recurrent layers", 1, 16)
    assert all(hyper.applies_to(name) for name in (*BUILT_IN, "not_registered_yet"))
    assert hyper.allowed() == "an integer in [1, 16]" and hyper.accepts(3) and not hyper.accepts(True)


def test_a_registered_family_is_listed_last_and_accepted_by_configs(register):
    register(replace(family("mogrifier"), name="plugin_mogrifier"))
    assert family_names()[-1] == models.FAMILIES[-1] == "plugin_mogrifier" != FAMILIES[-1]  # FAMILIES: when imported
    assert ModelConfig(vocab_size=10, hidden_size=4, family="plugin_mogrifier", mogrifier_rounds=2).cell == "lstm"
    assert family_hyperparameters()["mogrifier_rounds"][1] == ("mogrifier", "mogrifier_rlstm", "mogrifier_gru",
                                                               "plugin_mogrifier")
    with pytest.raises(ValueError, match=r"mogrifier_rounds: got 2; allowed: 0 for family 'rlstm' \(use family "
                                         r"'mogrifier' or 'mogrifier_rlstm' or 'mogrifier_gru' or "
                                         r"'plugin_mogrifier'\)"):
        ModelConfig(vocab_size=10, hidden_size=4, family="rlstm", mogrifier_rounds=2)


def test_registering_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="family: 'lstm' is already registered; choose another name"):
        register_family(replace(family("mlstm"), name="lstm"))
    assert family("lstm").cell == "lstm"


def test_a_hyperparameter_defined_differently_from_another_familys_is_refused():
    narrow = replace(family("mogrifier").hyperparameters[0], high=3)
    with pytest.raises(ValueError, match="'mogrifier_rounds' of family 'narrow' differs from the one family 'mog"):
        register_family(replace(family("mogrifier"), name="narrow", hyperparameters=(narrow,),
                                defaults={"mogrifier_rounds": 0}))
    assert "narrow" not in FAMILY_REGISTRY


@pytest.mark.parametrize(("changes", "message"), [
    (dict(cell="elman"), r"cell: got 'elman' for family 'broken'; allowed: lstm, rlstm, mlstm, gru"),
    (dict(hyperparameters=family("mogrifier").hyperparameters[:1] * 2, defaults={"mogrifier_rounds": 0}),
     r"hyperparameters: family 'broken' declares mogrifier_rounds twice"),
    (dict(defaults={"mogrifier_rounds": 0}), r"defaults: got mogrifier_rounds for family 'broken'; allowed: exactly"),
    (dict(defaults={"mogrifier_rounds": 9, "mogrifier_rank": 0}),
     r"defaults: mogrifier_rounds of family 'broken' is 9; allowed: an integer in \[0, 6\]"),
    (dict(hyperparameters=(replace(family("mogrifier").hyperparameters[0], families=("broken",)),),
          defaults={"mogrifier_rounds": 0}), r"mogrifier_rounds of family 'broken' name families"),
])
def test_an_inconsistent_family_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        replace(family("mogrifier"), name="broken", **changes)


OUTER = list(itertools.product((50, 10_000), (True, False), (1, 3), (False, True)))
"""Vocabulary, tied embeddings, softmax components, residual connections: all but the layers' shapes."""
LAYERS = list(itertools.product((1, 7, 64, 333), (1, 2, 3), (0.3, 1.0)))
"""Hidden size, layers, embedding ratio: the shapes of the layers (and of the rest)."""
MOGRIFIER = list(itertools.product(range(6), (0, 1, 40)))
"""Rounds and rank."""


def _grid(name: str):
    """Every combination of OUTER and LAYERS, and for a mogrifier family every one of LAYERS and MOGRIFIER, the
    remaining axis cycling through its values: the mogrifier's shapes depend only on the layers' shapes, and so do
    the embedding's and the softmax's on the mogrifier's."""
    mogrifier = family(name).mogrifier
    settings = MOGRIFIER if mogrifier else [(0, 0)]
    rows = [(*outer, *layers, *rounds_and_rank)
            for (outer, layers), rounds_and_rank in zip(itertools.product(OUTER, LAYERS), itertools.cycle(settings))]
    if mogrifier:
        rows += [(*outer, *layers, *rounds_and_rank)
                 for (layers, rounds_and_rank), outer in zip(itertools.product(LAYERS, MOGRIFIER),
                                                             itertools.cycle(OUTER))]
    for vocab, tied, components, residual, hidden, layers, ratio, rounds, rank in rows:
        yield ModelConfig(vocab_size=vocab, hidden_size=hidden, family=name, num_layers=layers,
                          input_embedding_ratio=ratio, tie_embeddings=tied, softmax_components=components,
                          residual_connections=residual, mogrifier_rounds=rounds, mogrifier_rank=rank)


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_the_closed_form_equals_the_meta_device_count(name):
    closed_form = family(name).parameter_count
    assert closed_form is not None
    for config in _grid(name):
        assert closed_form(config) == count_parameters_by_building(config), config


@pytest.mark.parametrize("name", CLOSED_FORM)
def test_a_family_without_a_closed_form_is_solved_on_the_meta_device_to_the_same_hidden_size(name, register):
    register(replace(family(name), name=f"built_{name}", parameter_count=None))
    shape = ModelConfig(vocab_size=10_001, hidden_size=1, family=name, num_layers=2,
                        mogrifier_rounds=5 if family(name).mogrifier else 0, mogrifier_rank=84)
    closed_form = solve_hidden_size(shape, 24_000_000)
    built = solve_hidden_size(replace(shape, family=f"built_{name}"), 24_000_000)
    assert built.hidden_size == closed_form.hidden_size
    assert count_parameters(built) == count_parameters(closed_form) <= 24_000_000
    if name == "mogrifier":  # docs/methodology.md's test vector
        assert (built.hidden_size, count_parameters(built)) == (912, 23_987_393)


def test_the_meta_device_path_refuses_a_budget_too_small_in_the_same_words(register):
    register(replace(family("lstm"), name="built_lstm", parameter_count=None))
    smallest = count_parameters(ModelConfig(vocab_size=10_000, hidden_size=1))
    with pytest.raises(ValueError, match=f"parameter_budget: 1,000 is too small .* smallest model has {smallest:,} "):
        solve_hidden_size(ModelConfig(vocab_size=10_000, hidden_size=1, family="built_lstm"), 1_000)
