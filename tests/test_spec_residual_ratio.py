"""Residual families need embedding size = hidden size (Melis thesis §4.2): a spec that fixes or searches
`input_embedding_ratio` other than 1 for one is refused, naming the field, the family, the value, why, and the line."""

from __future__ import annotations

import pytest
import yaml

from lm_tuner.models import Family
from lm_tuner.models.families import FAMILY_REGISTRY, register_family
from lm_tuner.tuner.spec import SpecError, parse_spec
from lm_tuner.tuner.spec.shipped import shipped_spaces

RESIDUAL = [f.name for f in FAMILY_REGISTRY.values() if f.residual and not f.mogrifier]
PLAIN = [f.name for f in FAMILY_REGISTRY.values() if not f.residual and not f.mogrifier]
RATIO = "input_embedding_ratio"


def spec_text(families: list[str], fixed: dict | None = None, search_space: dict | None = None) -> str:
    return yaml.safe_dump({
        "name": "residual",
        "dataset": {"generator": "markov", "vocab_size": 20},
        "families": families,
        "parameter_budget": 8000,
        "fixed": {"num_layers": 2, **(fixed or {})},
        "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}, **(search_space or {})},
        "tuning": {"trials": 1},
    }, sort_keys=False)


def refused(text: str) -> tuple[SpecError, str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="spec.yaml")
    return caught.value, str(caught.value)


def line_of(text: str, key: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if line.strip().startswith(f"{key}:"))


def test_the_registry_has_residual_and_plain_families_to_test_with():
    assert RESIDUAL and PLAIN


@pytest.mark.parametrize("value", [0.5, 0.0, 2.0])
def test_a_fixed_ratio_other_than_one_is_refused_with_field_family_value_reason_and_line(value):
    text = spec_text(RESIDUAL[:1], fixed={RATIO: value})
    error, message = refused(text)
    [issue] = error.issues
    assert issue.field == f"fixed.{RATIO}" and issue.line == line_of(text, RATIO)
    assert f"got {value!r}" in issue.message and repr(RESIDUAL[0]) in issue.message
    assert "m = n" in issue.message and "§4.2" in issue.message and "allowed: 1" in issue.message
    assert message.splitlines()[1].strip().startswith(f"spec.yaml:{issue.line}: fixed.{RATIO}: got")


def test_a_searched_ratio_is_refused_for_every_residual_family_that_would_search_it():
    residual = [f.name for f in FAMILY_REGISTRY.values() if f.residual]
    mogrifier = {"mogrifier_rounds": 2, "mogrifier_rank": 2}
    text = spec_text(residual, fixed=mogrifier, search_space={RATIO: {"low": 0.0, "high": 2.0}})
    error, _ = refused(text)
    [issue] = error.issues
    assert issue.field == f"search_space.{RATIO}" and issue.line == line_of(text, RATIO)
    assert "[0.0, 2.0]" in issue.message and all(repr(name) in issue.message for name in residual)
    assert "leave it out" in issue.message and "m = n" in issue.message


def test_a_search_shared_with_a_plain_family_says_to_restrict_it_to_that_family():
    text = spec_text([PLAIN[0], RESIDUAL[0]], search_space={RATIO: {"low": 0.25, "high": 1.0}})
    error, _ = refused(text)
    [issue] = error.issues
    assert repr(RESIDUAL[0]) in issue.message and repr(PLAIN[0]) not in issue.message.split("; allowed")[0]
    assert f"search it for {PLAIN[0]!r} only" in issue.message
    restricted = {RATIO: {"low": 0.25, "high": 1.0, "families": [PLAIN[0]]}}
    spec = parse_spec(spec_text([PLAIN[0], RESIDUAL[0]], search_space=restricted))
    assert RATIO in spec.searched_for(PLAIN[0]) and RATIO not in spec.searched_for(RESIDUAL[0])


@pytest.mark.parametrize("value", [1, 1.0])
def test_a_ratio_of_one_is_accepted(value):
    spec = parse_spec(spec_text(RESIDUAL[:1], fixed={RATIO: value}))
    assert spec.fixed_for(RESIDUAL[0])[RATIO] == 1
    assert parse_spec(spec_text(RESIDUAL[:1], search_space={RATIO: {"choices": [1.0]}})).searched_for(RESIDUAL[0])
    assert parse_spec(spec_text(RESIDUAL[:1])).fixed == {"num_layers": 2}  # left out: the model's default of 1


def test_plain_families_may_still_fix_or_search_any_ratio():
    parse_spec(spec_text(PLAIN[:1], fixed={RATIO: 0.5}))
    parse_spec(spec_text(PLAIN[:1], search_space={RATIO: {"low": 0.0, "high": 2.0}}))


def test_the_check_reads_the_registry_flag_so_a_plugin_residual_family_is_covered():
    plugin = register_family(Family("plugin_residual", cell="rlstm", mogrifier=False, residual=True,
                                    paper="a test", description="a residual family registered by a plugin"))
    try:
        error, _ = refused(spec_text([plugin.name], fixed={RATIO: 0.5}))
        assert "'plugin_residual'" in error.issues[0].message
    finally:
        del FAMILY_REGISTRY[plugin.name]


def test_a_value_other_checks_refuse_is_reported_once():
    error, _ = refused(spec_text(RESIDUAL[:1], fixed={RATIO: -1.0}))
    assert [issue.field for issue in error.issues] == [f"fixed.{RATIO}"] and "residual" not in error.issues[0].message


@pytest.mark.parametrize("space", shipped_spaces(), ids=lambda space: space.name)
def test_every_shipped_space_still_validates(space):
    spec = parse_spec(space.text, source=space.name)
    for name in spec.families:
        if FAMILY_REGISTRY[name].residual:
            assert RATIO not in spec.searched_for(name) and spec.fixed_for(name).get(RATIO, 1) == 1
