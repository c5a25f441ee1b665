"""Spec documents built to hurt (issue 18): each is refused fast, as a SpecError naming the field or line,
and never as any other exception; what can be known not to run is refused before it is queued."""

from __future__ import annotations

import copy
import json
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lm_tuner.tuner.spec import INT32_MAX, SpecError, StudySpec, load_spec, parse_spec
from lm_tuner.tuner.spec.feasibility import budget_issues, submission_issues
from lm_tuner.tuner.spec.yaml_loader import MAX_CHARACTERS, MAX_DEPTH, MAX_VALUES, load_document, shown
from tests.conftest import TINY_SPEC

BASE = {**TINY_SPEC, "description": "a tiny study"}
TINY_JSON = json.dumps(BASE)


def issues_of(document):
    with pytest.raises(SpecError) as caught:
        parse_spec(document, source="spec.yaml")
    return {issue.field: issue for issue in caught.value.issues}


def with_fields(**fields) -> str:
    return json.dumps({**BASE, **fields})


def laughs(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, levels)]
    return "\n".join(lines) + f"\ndescription: *a{levels - 1}\n"


def test_billion_laughs_is_refused_in_milliseconds_at_its_line():
    started = time.perf_counter()
    issues = issues_of(laughs(9))  # 9**9 = 387 million strings once expanded
    assert time.perf_counter() - started < 1.0
    (issue,) = issues.values()
    assert f"more than {MAX_VALUES:,} values" in issue.message and issue.line == 4  # a3: 9**4 > 5,000
    within_bound = issues_of(laughs(3))  # 9**3 strings: read, then validated like any document
    assert {"a0", "a1", "a2", "description", "name"} <= set(within_bound)
    assert within_bound["description"].message.startswith("Input should be a valid string")


@pytest.mark.parametrize("document", ["families: &f [lstm, *f]\n", "fixed: &x {num_layers: 1, again: *x}\n",
                                      "search_space: &s {<<: *s}\n"])
def test_a_recursive_alias_is_refused_at_its_line(document):
    (issue,) = issues_of("name: x\n" + document).values()
    assert "refers to a collection that contains it" in issue.message and issue.line == 2


@pytest.mark.parametrize("document", ["[" * 5000 + "]" * 5000, '{"a": ' * 5000 + "1" + "}" * 5000,
                                      "".join(f"{'  ' * i}k{i}:\n" for i in range(MAX_DEPTH + 5)) + "  v: 1\n"])
def test_deep_nesting_is_refused_before_recursion_can_fail(document):
    (issue,) = issues_of(document).values()
    assert "nest" in issue.message and issue.line is not None


def test_a_long_text_repeated_by_aliases_counts_each_copy():
    started = time.perf_counter()
    (issue,) = issues_of("a: &a '" + "x" * 200_000 + "'\nb: [" + ", ".join(["*a"] * 5000) + "]\n").values()
    assert time.perf_counter() - started < 1.0
    assert f"more than {MAX_CHARACTERS:,} characters" in issue.message and issue.line == 2


def test_integers_python_cannot_read_are_located_errors():
    issues = issues_of(TINY_JSON[:-1] + ', "extra": ' + "9" * 5000 + "}")
    assert "an integer written with 5,000 characters" in issues[""].message and issues[""].line == 1
    hexadecimal = issues_of("name: x\nparameter_budget: 0x" + "f" * 200 + "\n")
    assert hexadecimal[""].line == 2


@pytest.mark.parametrize("path", [("name",), ("description",), ("families", 0), ("tuning", "sampler"),
                                  ("dataset", "generator")])
@pytest.mark.parametrize("control", ["\x00", "\x1b", "\x7f"])
def test_control_characters_in_any_text_name_the_field(path, control):
    data = json.loads(TINY_JSON)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] += control
    issue = issues_of(json.dumps(data))[".".join(map(str, path))]
    assert f"U+{ord(control):04X}" in issue.message and issue.line == 1


def test_a_control_character_in_a_key_is_named_with_an_escape():
    data = {**TINY_SPEC, "search_space": {**TINY_SPEC["search_space"], "learning\x00rate": {"low": 0, "high": 1}}}
    issue = issues_of(json.dumps(data))["search_space.learning\\u0000rate"]
    assert "the key contains the control character U+0000" in issue.message


def test_parse_spec_of_a_mapping_is_held_to_the_same_rules():
    issues = issues_of({**TINY_SPEC, "description": "a\x00b", "parameter_budget": 2**63})
    assert {"description", "parameter_budget"} <= set(issues)


def test_a_key_given_twice_is_refused_with_its_path_and_line(tiny_spec):
    document = tiny_spec().replace("  trials: 1\n", "  trials: 1\n  trials: 5\n")
    issue = issues_of(document)["tuning.trials"]
    first = document.splitlines().index("  trials: 1") + 1
    assert f"given twice in this mapping (first on line {first})" in issue.message and issue.line == first + 1
    assert "name" in issues_of('{"name": "a", ' + TINY_JSON[1:])
    merged = tiny_spec() + "evaluation:\n  <<: {bptt: 5, mc_samples: 0}\n  bptt: 7\n"  # a merged key may be overridden
    assert parse_spec(merged).evaluation.bptt == 7


@pytest.mark.parametrize("path", [("parameter_budget",), ("tuning", "trials"), ("training", "batch_size"),
                                  ("training", "steps_per_turn"), ("search_space", "learning_rate", "low"),
                                  ("search_space", "learning_rate", "log")])
def test_booleans_and_numbers_are_not_interchangeable(path):
    data = json.loads(TINY_JSON)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = 1 if isinstance(target[path[-1]], bool) else True
    assert "should be a valid" in issues_of(json.dumps(data))[".".join(path)].message


def test_booleans_in_fixed_values_and_initial_points_name_the_hyperparameter():
    fixed = issues_of(with_fields(fixed={"num_layers": True, "mogrifier_rank": 2}))["fixed.num_layers"]
    assert fixed.message == "got True; allowed: an integer in [1, 16]"
    point = issues_of(with_fields(tuning={"trials": 1, "initial_points": [{"learning_rate": "0.005"}]}))
    assert point["tuning.initial_points.0.learning_rate"].message == "must be a number or true/false (got '0.005')"


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 10**30])
@pytest.mark.parametrize("path", [("parameter_budget",), ("tuning", "seed"), ("dataset", "train_tokens"),
                                  ("fixed", "mogrifier_rank")])
def test_integers_beyond_the_database_columns_name_the_bound(path, value):
    data = json.loads(TINY_JSON)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    issue = issues_of(json.dumps(data))[".".join(path)]
    assert f"[-2147483648, {INT32_MAX}]" in issue.message and issue.line == 1


@pytest.mark.parametrize("number", [".inf", "-.inf", ".nan", "1e999"])
def test_numbers_must_be_finite(tiny_spec, number):
    document = tiny_spec().replace("low: 0.001", f"low: {number}")
    issue = issues_of(document)["search_space.learning_rate.low"]
    assert "allowed: a finite number" in issue.message and issue.line is not None


def test_dates_are_text_and_json_exponent_floats_are_numbers():
    assert parse_spec(with_fields(description=None).replace("null", "2020-01-01")).description == "2020-01-01"
    data, _ = load_document('{"a": 1e-05, "b": 2E3, "c": -1.5e+2}')  # YAML 1.1 reads these as text
    assert data == {"a": 1e-05, "b": 2000.0, "c": -150.0}
    spec = parse_spec(json.dumps({**TINY_SPEC, "search_space": {"learning_rate": {"low": 1e-05, "high": 1e-2},
                                                                "mogrifier_rounds": {"low": 1, "high": 4}}}))
    assert spec.search_space["learning_rate"].low == 1e-05


def test_surrogate_pairs_of_json_are_joined_and_lone_ones_refused():
    text = json.dumps({**TINY_SPEC, "description": "smile \U0001f600"})  # written as \\ud83d\\ude00
    assert parse_spec(text).description == "smile \U0001f600"
    assert "lone surrogate" in issues_of(text.replace("\\ude00", ""))[""].message


@pytest.mark.parametrize("tag", ["!!binary AAAA", "!!set {a}", "!!timestamp 2020-01-01", "!!bool maybe", "!!int abc"])
def test_tags_beyond_json_values_are_refused_at_their_line(tag):
    issue = issues_of(f"name: x\ndescription: {tag}\n")[""]
    assert issue.line == 2


def test_a_file_with_an_attack_is_reported_with_its_name_and_line(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs(9))
    with pytest.raises(SpecError, match=r"laughs\.yaml:4: the document holds more than"):
        load_spec(path)


def storable(spec: StudySpec) -> bool:
    """What the database can hold: JSON without NaN, 32-bit integers, text without NUL."""
    def fits(value) -> bool:
        if isinstance(value, dict):
            return all(fits(key) and fits(item) for key, item in value.items())
        if isinstance(value, list):
            return all(fits(item) for item in value)
        if isinstance(value, int) and not isinstance(value, bool):
            return -(2**31) <= value <= INT32_MAX
        return not isinstance(value, str) or "\x00" not in value

    data = spec.model_dump(mode="json")
    json.dumps(data, allow_nan=False)
    return fits(data)


EXAMPLES = settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@EXAMPLES
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=50), st.booleans())
def test_any_description_is_kept_as_given_or_refused(text, as_yaml):
    document = yaml.safe_dump({**BASE, "description": text}) if as_yaml else with_fields(description=text)
    try:
        spec = parse_spec(document)
    except SpecError:
        return
    assert spec.description == text and storable(spec)


def leaves(data, path=()):
    if isinstance(data, dict):
        return [leaf for key, value in data.items() for leaf in leaves(value, (*path, key))]
    if isinstance(data, list):
        return [leaf for index, value in enumerate(data) for leaf in leaves(value, (*path, index))]
    return [path]


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=30)
VALUES = st.integers(min_value=2**31 - 2, max_value=2**70) | st.integers(max_value=-(2**31) + 2) | JSON_VALUES


@EXAMPLES
@given(st.sampled_from(leaves(BASE)), VALUES, st.booleans())
def test_any_value_in_any_field_is_refused_or_storable(path, value, as_yaml):
    data = copy.deepcopy(BASE)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    try:
        text = yaml.safe_dump(data) if as_yaml else json.dumps(data)
    except ValueError:  # an integer Python will not write
        return
    try:
        spec = parse_spec(text)
    except SpecError:
        return
    assert storable(spec)


def test_names_that_select_nothing_are_issues_not_crashes():
    space = {**TINY_SPEC["search_space"], "momentum": {"low": 0.1, "high": 0.9}}
    assert "unknown hyperparameter" in issues_of(with_fields(search_space=space))["search_space.momentum"].message
    generator = issues_of(with_fields(dataset={**TINY_SPEC["dataset"], "generator": ["markov"]}))["dataset.generator"]
    assert "unknown generator ['markov']" in generator.message


def test_a_budget_no_model_fits_names_the_family_and_the_smallest_model():
    spec = parse_spec(with_fields(parameter_budget=30))
    issues = budget_issues(spec, 20)
    assert [i.field for i in issues] == ["parameter_budget", "parameter_budget"]
    assert "family 'lstm': 30 is too small for vocabulary 20" in issues[0].message
    assert "the smallest model has 52 parameters" in issues[0].message
    assert submission_issues(spec) == issues  # a generated corpus fixes its vocabulary
    assert budget_issues(spec, 3) == [] and budget_issues(parse_spec(TINY_JSON), 20) == []


def test_submission_uses_the_vocabulary_the_dataset_section_fixes():
    ptb = parse_spec(with_fields(dataset={"name": "ptb"}, parameter_budget=15_000))
    assert "vocabulary 10,000" in submission_issues(ptb)[0].message
    local = parse_spec(with_fields(dataset={"path": "/nowhere", "format": "ptb"}, parameter_budget=15_000))
    assert submission_issues(local) == []  # its vocabulary is only known once it is read
    tiny = parse_spec(with_fields(dataset={"path": "/nowhere", "format": "ptb"}, parameter_budget=10))
    assert "known only once it is loaded" in submission_issues(tiny)[0].message


def test_a_fixed_value_no_model_accepts_is_named():
    spec = parse_spec(with_fields(fixed={"num_layers": 1, "mogrifier_rank": 2, "chrono_t_max": 1.5}))
    (issue, _) = submission_issues(spec)
    assert issue.field == "fixed.chrono_t_max" and "0 (forget bias mean 1) or a number > 2" in issue.message


@pytest.mark.parametrize("fields", [{"tuning": {"trials": 1, "seed": -1}}, {"tuning": {"trials": 1, "seed": 2**30 + 1}},
                                    {"tuning": {"trials": 1_000_001}}, {"reruns": {"seeds": 1001}},
                                    {"dataset": {**TINY_SPEC["dataset"], "seed": -1}}])
def test_seeds_stay_where_numpy_and_the_seed_column_can_take_them(fields):
    assert issues_of(with_fields(**fields))


def test_shown_cuts_long_values_and_never_writes_huge_integers():
    assert shown("x" * 1000).endswith("... (1,002 characters)") and len(shown("x" * 1000)) < 90
    assert shown(10**5000) == "an integer of 16,610 bits"
    assert shown([1, 2]) == "[1, 2]"


@pytest.mark.parametrize("dataset, field", [
    ({"generator": "markov", "vocab_size": 20, "train_tokens": 2_000_000_000}, "dataset.train_tokens"),
    ({"generator": "reverse-copy", "symbols": 10, "length": 4, "train_examples": 2_000_000_000},
     "dataset.train_examples")])
def test_a_generated_corpus_too_large_to_hold_is_refused_before_anything_generates_it(dataset, field):
    """Whoever generates a corpus holds it in memory (a worker, for a study submitted over REST): 2 billion tokens
    would take it down, so the spec refuses it, naming the field and the bound."""
    with pytest.raises(SpecError, match=rf"{field}: .*less than or equal to"):
        parse_spec(yaml.safe_dump({**TINY_SPEC, "dataset": dataset}))
