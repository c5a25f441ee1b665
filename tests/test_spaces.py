"""The shipped study spaces: the full-size ones are accepted as they are and fit their budgets; their
CPU-sized twins mirror them and run end to end; every value says where it comes from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from lm_tuner.models import count_parameters
from lm_tuner.tuner.analysis.comparison import comparison
from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import StudySpec, load_spec, parse_spec
from lm_tuner.tuner.spec.space import trial_setup

SPACES = Path(__file__).parent.parent / "spaces"
FULL_SIZE = ["lstm_ptb", "mogrifier_ptb", "rlstm_ptb", "mogrifier_rlstm_ptb", "mogrifier_wt2", "mogrifier_enwik8",
             "mogrifier_ptb_char", "ptb_comparison", "awd_lstm_ptb", "transformer_vs_mogrifier_ptb"]
SOURCED = [*FULL_SIZE, *(f"small/{name}" for name in FULL_SIZE)]
CPU_SIZED = ["ptb_comparison_cpu"]  # real corpora, sized for a few CPU cores: this project's own values
PTB_CHAR = [name for name in SOURCED if name.endswith("ptb_char")]
VOCABULARY = {"ptb": 10_000, "wikitext-2": 33_279, "ptb-char": 50, "enwik8": 206}  # with <eos>


@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size_space_is_accepted_and_fits_its_budget(name):
    spec = load_spec(SPACES / f"{name}.yaml")
    vocab_size = VOCABULARY[spec.dataset.name]
    for family in spec.families:
        searched = spec.searched_for(family)
        middle = {key: space.choices[0] if space.choices else (space.low + space.high) / 2
                  for key, space in searched.items()}
        setup = trial_setup(spec, family, middle, vocab_size, seed=0)
        assert 0.99 * spec.parameter_budget <= count_parameters(setup.model) <= spec.parameter_budget
    assert spec.evaluation is not None and spec.dynamic_evaluation is not None and spec.reruns is not None
    assert spec.training.budget_epochs is not None
    assert spec.character_level == (spec.dataset.name in ("ptb-char", "enwik8"))


@pytest.mark.parametrize("name", FULL_SIZE)
def test_full_size_space_survives_the_trip_to_a_trial(name):
    # Trials receive the spec as JSON (model_dump) and validate it again; an epoch budget once came
    # back beside the default `turns` and every trial of every full-size space failed to start.
    spec = load_spec(SPACES / f"{name}.yaml")
    assert StudySpec.model_validate(spec.model_dump(mode="json")) == spec


@pytest.mark.parametrize("name", FULL_SIZE)
def test_small_twin_mirrors_the_full_size_space(name):
    full = yaml.safe_load((SPACES / f"{name}.yaml").read_text())
    small = yaml.safe_load((SPACES / "small" / f"{name}.yaml").read_text())
    load_spec(SPACES / "small" / f"{name}.yaml")
    assert small["families"] == full["families"]
    assert small["search_space"] == full["search_space"]
    assert set(small["fixed"]) == set(full["fixed"])
    budgets = {"budget_epochs", "budget_steps", "budget_seconds", "turns"}
    assert set(full["training"]) - budgets <= set(small["training"])
    for shared in ("optimizer", "averaging", "dropout_samples"):
        assert small["training"].get(shared) == full["training"].get(shared)
    assert {"reruns", "evaluation", "dynamic_evaluation"} <= set(small)
    assert bool(small["evaluation"]["mc_samples"]) == bool(full["evaluation"]["mc_samples"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mogrifier_ptb_char"])  # one twin (about a minute): every twin runs the same stages
def test_small_twin_runs_every_stage(name, ray_cluster, sqlite_url, tmp_path):
    document = (SPACES / "small" / f"{name}.yaml").read_text()
    spec = parse_spec(document)
    assert launch_study(spec, document, Settings(sqlite_url, tmp_path / "artifacts")) == "complete"
    table = comparison(sqlite_url, spec.name)
    assert table.unit == ("bpc" if spec.character_level else "perplexity")
    (row,) = table.families
    assert row.valid.count == 2 and row.test.count == 2 and row.dynamic_test is not None
    assert table.winner is None and table.verdict == f"one family ({spec.families[0]}): nothing to compare it with, " \
                                                    "so no winner"


def test_every_shipped_comparison_reruns_each_family_s_best_with_three_seeds_or_more():
    """A winner is named only where the reruns' seeds separate it (the 95% interval of the difference excludes 0):
    every shipped space comparing families gives it three seeds or more a family."""
    comparisons = [path for path in sorted(SPACES.rglob("*.yaml")) if len(load_spec(path).families) > 1]
    assert {path.stem for path in comparisons} == {"quickstart", "ptb_comparison", "transformer_vs_mogrifier_ptb",
                                                   "ptb_comparison_cpu"}
    short = [path.relative_to(SPACES).as_posix() for path in comparisons
             if load_spec(path).reruns is None or load_spec(path).reruns.seeds < 3]
    assert short == []


def test_every_space_but_the_project_s_own_is_checked_for_sources():
    shipped = {path.relative_to(SPACES).with_suffix("").as_posix() for path in SPACES.rglob("*.yaml")}
    assert shipped - set(SOURCED) == {"quickstart", *CPU_SIZED}
    for name in ("quickstart", *CPU_SIZED):
        assert "Every value here is this project's choice" in (SPACES / f"{name}.yaml").read_text()


@pytest.mark.parametrize("name", CPU_SIZED)
def test_a_cpu_sized_real_corpus_space_has_a_budget_for_the_whole_study_and_starts_from_the_priors(name):
    spec = load_spec(SPACES / f"{name}.yaml")
    assert spec.dataset.name in VOCABULARY and spec.compute_budget is not None and spec.tuning.priors
    assert spec.training.validation_tokens is not None  # turns score a subset: evaluation does not eat the budget


def value_spans(node: Node) -> list[tuple[int, int]]:
    """The first and last line of each value written out in a space (a scalar or a {...} / [...] collection,
    with its key), at any depth; `name` and `description` are not values."""
    if isinstance(node, ScalarNode) or node.flow_style:
        return [(node.start_mark.line, node.end_mark.line)]
    spans = []
    if isinstance(node, MappingNode):
        for key, value in node.value:
            if key.value in ("name", "description"):
                continue
            inner = value_spans(value)
            if isinstance(value, ScalarNode) or value.flow_style:
                inner = [(key.start_mark.line, inner[0][1])]
            spans += inner
    elif isinstance(node, SequenceNode):
        for item in node.value:
            spans += value_spans(item)
    return spans


def has_comment(line: str) -> bool:
    return re.search(r"(^|\s)#", line) is not None


@pytest.mark.parametrize("name", SOURCED)
def test_every_value_of_a_space_has_a_comment_giving_its_source(name):
    # Issue 21: every value names its source (a paper's table or section, the full space, or this project), on
    # its own line(s) or in the comment line right above it; a comment on a block header does not count.
    lines = (SPACES / f"{name}.yaml").read_text().splitlines()
    unsourced = [f"{first + 1}: {lines[first].strip()}" for first, last in value_spans(yaml.compose("\n".join(lines)))
                 if not any(has_comment(line) for line in lines[first:last + 1])
                 and not (first > 0 and lines[first - 1].lstrip().startswith("#"))]
    assert unsourced == []


@pytest.mark.parametrize("name", PTB_CHAR)
def test_ptb_char_spaces_have_the_papers_two_layers(name):
    # Mogrifier (d2) on character-level PTB (Mogrifier paper Table 2, thesis Table 2.2); it once shipped with 3.
    assert yaml.safe_load((SPACES / f"{name}.yaml").read_text())["fixed"]["num_layers"] == 2
