"""The study spec: what is accepted, and errors that name the line, the field and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lm_tuner.tuner.spec import SpecError, load_spec, parse_spec

SPACES = Path(__file__).parent.parent / "spaces"


def issues_of(document, source="spec.yaml"):
    with pytest.raises(SpecError) as caught:
        parse_spec(document, source=source)
    return {issue.field: issue for issue in caught.value.issues}, str(caught.value)


def test_quickstart_compares_lstm_and_mogrifier_with_at_least_six_trials():
    spec = load_spec(SPACES / "quickstart.yaml")
    assert spec.families == ["lstm", "mogrifier"]
    assert spec.tuning.trials * len(spec.families) >= 6
    assert spec.tuning.sampler == "gp"
    assert set(spec.searched_for("lstm")) == {"learning_rate", "input_dropout", "output_dropout"}
    assert set(spec.searched_for("mogrifier")) >= {"mogrifier_rounds", "mogrifier_rank"}


def test_unknown_field_names_its_line_and_the_allowed_fields(tiny_spec):
    document = tiny_spec().replace("  generator: markov\n", "  generator: markov\n  colour: blue\n")
    issues, message = issues_of(document)
    issue = issues["dataset.colour"]
    assert issue.line == document.splitlines().index("  colour: blue") + 1
    assert "unknown field" in issue.message and "vocab_size" in issue.message and "train_tokens" in issue.message
    assert f"spec.yaml:{issue.line}: dataset.colour" in message


def test_bad_choice_lists_the_allowed_values(tiny_spec):
    document = tiny_spec(tuning={"sampler": "cmaes", "trials": 2})
    issues, _ = issues_of(document)
    assert "'gp', 'tpe', 'random' or 'qmc'" in issues["tuning.sampler"].message
    assert "cmaes" in issues["tuning.sampler"].message


def test_the_name_of_the_new_study_page_is_refused(tiny_spec):
    issues, _ = issues_of(tiny_spec(name="new"))
    assert "reserved" in issues["name"].message and "/dashboard/studies/new" in issues["name"].message
    assert parse_spec(tiny_spec(name="newer")).name == "newer"


def test_unknown_family_is_refused(tiny_spec):
    issues, _ = issues_of(tiny_spec(families=["lstm", "elman"]))
    assert ("'lstm', 'mogrifier', 'rlstm', 'mogrifier_rlstm', 'mlstm', 'awd_lstm', 'gru', 'mogrifier_gru' or "
            "'transformer'"
            in issues["families.1"].message)


def test_out_of_range_fixed_value_names_the_allowed_range(tiny_spec):
    issues, _ = issues_of(tiny_spec(fixed={"num_layers": 1, "mogrifier_rank": 2, "input_dropout": 1.5}))
    assert issues["fixed.input_dropout"].message == "got 1.5; allowed: a number in [0, 1)"


def test_unknown_hyperparameter_lists_the_known_ones(tiny_spec):
    issues, _ = issues_of(tiny_spec(fixed={"num_layers": 1, "mogrifier_rank": 2, "momentum": 0.9}))
    message = issues["fixed.momentum"].message
    assert "unknown hyperparameter" in message and "learning_rate" in message and "state_dropout" in message


def test_range_errors(tiny_spec):
    space = {"learning_rate": {"low": 0.01, "high": 0.001, "log": True},
             "mogrifier_rounds": {"low": 1, "high": 9},
             "output_dropout": {"low": 0.0, "high": 0.5, "log": True}}
    issues, _ = issues_of(tiny_spec(search_space=space))
    assert "must be greater than low" in issues["search_space.learning_rate.high"].message
    assert issues["search_space.mogrifier_rounds.high"].message == "got 9.0; allowed: an integer in [0, 6]"
    assert "log-scaled range needs low > 0" in issues["search_space.output_dropout.low"].message


def test_fixed_and_searched_at_once_is_refused(tiny_spec):
    issues, _ = issues_of(tiny_spec(fixed={"num_layers": 1, "mogrifier_rank": 2, "learning_rate": 0.01}))
    assert "either fixed or searched" in issues["fixed.learning_rate"].message


def test_family_specific_hyperparameters_need_that_family(tiny_spec):
    issues, _ = issues_of(tiny_spec(families=["lstm"], fixed={"num_layers": 1, "mogrifier_rank": 2}))
    assert "applies to families mogrifier" in issues["fixed.mogrifier_rank"].message
    assert "applies to families mogrifier" in issues["search_space.mogrifier_rounds"].message


def test_mogrifier_families_need_their_rounds_and_rank(tiny_spec):
    issues, _ = issues_of(tiny_spec(fixed={"num_layers": 1}))
    assert "family 'mogrifier' needs 'mogrifier_rank'" in issues["fixed"].message
    rlstm = tiny_spec(families=["mogrifier_rlstm"], fixed={"num_layers": 1, "mogrifier_rank": 2},
                      search_space={"learning_rate": {"low": 0.001, "high": 0.01, "log": True}})
    issues, _ = issues_of(rlstm)
    assert "family 'mogrifier_rlstm' needs 'mogrifier_rounds'" in issues["fixed"].message


def test_missing_required_fields_are_each_reported():
    issues, _ = issues_of("name: lonely\n")
    assert {"dataset", "families", "parameter_budget", "search_space", "tuning"} <= set(issues)
    assert all(issue.message == "required field is missing" for issue in issues.values())


def test_a_missing_dataset_format_lists_the_formats(tiny_spec):
    issues, message = issues_of(tiny_spec(dataset={"path": "/data"}))
    assert issues["dataset.format"].message == ("required field is missing; allowed: ptb, ptb-char, wikitext, enwik8, "
                                                "text8, text")
    assert issues["dataset.format"].line is not None


def test_invalid_yaml_reports_its_line():
    issues, message = issues_of("name: x\nfamilies: [lstm\n")
    assert "not valid YAML/JSON" in message
    assert issues[""].line is not None


def test_json_document_is_accepted_like_yaml(tiny_spec):
    data = yaml.safe_load(tiny_spec())
    assert parse_spec(json.dumps(data)) == parse_spec(tiny_spec()) == parse_spec(data)


def test_bad_name_is_refused(tiny_spec):
    issues, _ = issues_of(tiny_spec(name="../escape"))
    assert "name" in issues


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read the spec file"):
        load_spec(tmp_path / "absent.yaml")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    """read_spec checks the open descriptor, not only a stat before it: a path swapped for a FIFO is refused too."""
    import os
    import threading

    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    raised = []
    reader = threading.Thread(target=lambda: raised.append(pytest.raises(SpecError, load_spec, fifo)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # let the thread's open return, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("read_spec waited for a writer on a FIFO")
    assert "a FIFO (named pipe), not a regular file" in str(raised[0].value)


def test_matmul_precision_choices_and_their_effect_on_the_trial_process(tiny_spec, monkeypatch):
    import torch

    from lm_tuner.tuner.run import trial
    from lm_tuner.tuner.run.trial import configure_torch

    malloc_policy = []
    monkeypatch.setattr(trial, "keep_freed_memory", lambda: malloc_policy.append("kept"))

    issues, _ = issues_of(tiny_spec(resources={"float32_matmul_precision": "medium"}))
    assert "'highest' or 'high'" in issues["resources.float32_matmul_precision"].message
    spec = parse_spec(tiny_spec(resources={"float32_matmul_precision": "high", "cpus_per_trial": 2}))
    previous = torch.get_float32_matmul_precision(), torch.get_num_threads()
    try:
        configure_torch(spec, spec.resources.cpus_per_trial)
        assert (torch.get_float32_matmul_precision(), torch.get_num_threads()) == ("high", 2)
        assert malloc_policy == ["kept"]
    finally:
        torch.set_float32_matmul_precision(previous[0])
        torch.set_num_threads(previous[1])


@pytest.mark.parametrize("dataset, character_level", [
    ({"name": "ptb"}, False), ({"name": "ptb-char"}, True), ({"format": "enwik8", "path": "x"}, True),
    ({"format": "text", "path": "x"}, False), ({"format": "text", "path": "x", "level": "word"}, False),
    ({"format": "text", "path": "x", "level": "char"}, True),
])
def test_scores_are_in_bits_per_character_exactly_for_character_level_corpora(dataset, character_level):
    from lm_tuner.tuner.spec import is_character_level
    from lm_tuner.tuner.spec.units import unit_of

    assert is_character_level(dataset) is character_level
    assert unit_of({"dataset": dataset}).name == ("bpc" if character_level else "perplexity")
