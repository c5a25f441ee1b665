"""Studies start from what is known (`tuning.priors`, docs/methodology.md#priors): each published configuration of
deepmind/lamb mapped to this project's hyperparameters value for value, its regularisation scaled to the study's
training and budget, clipped into the searched ranges, and tried after the spec's own initial points."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from lm_tuner.trainers.datasets import PTB_SPLIT_TOKENS
from lm_tuner.tuner.spec import SearchRange, load_spec, parse_spec
from lm_tuner.tuner.spec.priors import (
    NO_COUNTERPART,
    SAME_NAME,
    clipped_into,
    family_prior,
    mapped_values,
    prior_points,
    reference_family,
    regularisation_scale,
    scaled_rank,
    scaled_values,
    study_training,
)
from lm_tuner.tuner.spec.published import REFERENCE_CONFIGURATIONS, TASKS
from lm_tuner.tuner.spec.space import initial_points
from tests.conftest import TINY_SPEC

SPACES = Path(__file__).parent.parent / "spaces"
COMMON = {"num_layers": 2, "cap_input_gate": True, "residual_connections": False, "embedding_dropout": 0.0}

# Each file of deepmind/lamb's lamb/experiment/mogrifier/config/ (commit 254a0b0e330c), in this project's names.
EXPECTED = {
    "786252db3825+_tune_ptb_24m_lstm_d2_arms/trial_833": {
        **COMMON, "learning_rate": 0.0030369099569192135, "l2_penalty": 0.00024908138497223704,
        "input_embedding_ratio": 1.0, "tie_embeddings": True, "softmax_components": 1,
        "input_dropout": 0.6275626425150355, "inter_layer_dropout": 0.3069926535017156,
        "state_dropout": 0.3692225400980858, "output_dropout": 0.6901712653612706},
    "786252db3825+_tune_ptb_24m_lstm_fm_d2_arms/trial_483": {
        **COMMON, "learning_rate": 0.002299987130225388, "l2_penalty": 0.00025235335778471014,
        "input_embedding_ratio": 1.0, "tie_embeddings": True, "softmax_components": 1,
        "input_dropout": 0.7290787773167251, "inter_layer_dropout": 0.2909822365241189,
        "state_dropout": 0.38729439899832296, "output_dropout": 0.7156690388448465,
        "mogrifier_rounds": 5, "mogrifier_rank": 84},
    "c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_d2_arms/trial_763": {
        **COMMON, "learning_rate": 0.003183909546336849, "l2_penalty": 0.00023063627783021125,
        "input_embedding_ratio": 0.3530770457779424, "tie_embeddings": True, "softmax_components": 2,
        "input_dropout": 0.6090979517941943, "inter_layer_dropout": 0.09075401405970591,
        "state_dropout": 0.2714030562283111, "output_dropout": 0.34845530389157287},
    "c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_fm_d2_arms/trial_747": {
        **COMMON, "learning_rate": 0.003287792100749033, "l2_penalty": 0.00018994987193751323,
        "input_embedding_ratio": 0.1993194960596213, "tie_embeddings": True, "softmax_components": 2,
        "input_dropout": 0.5469087645499495, "inter_layer_dropout": 0.1988228263748591,
        "state_dropout": 0.22137985867236876, "output_dropout": 0.34766651193735193,
        "mogrifier_rounds": 6, "mogrifier_rank": 48},
    "4d0a9a5bdb04+_tune_enwik8_48m_lstm_d4_arms/trial_400": {
        **COMMON, "num_layers": 4, "learning_rate": 0.002516709293528533, "l2_penalty": 2.5181258956042348e-05,
        "input_embedding_ratio": 1.0, "tie_embeddings": False, "softmax_components": 1,
        "input_dropout": 0.16279440026790548, "inter_layer_dropout": 0.11949666753873665,
        "state_dropout": 0.1036809388104279, "output_dropout": 0.13860156332143037},
    "4d0a9a5bdb04+_tune_enwik8_48m_lstm_fm_d4_arms/trial_234": {
        **COMMON, "num_layers": 4, "learning_rate": 0.001021423409385794, "l2_penalty": 0.000993383826740019,
        "input_embedding_ratio": 1.0, "tie_embeddings": False, "softmax_components": 1,
        "input_dropout": 0.015496029112930465, "inter_layer_dropout": 0.008633961431527571,
        "state_dropout": 0.0437288219541186, "output_dropout": 0.138307173174503,
        "mogrifier_rounds": 6, "mogrifier_rank": 79},
    "e81db31261c0+_tune_enwik8_96m_lstm_d4_arms/trial_295": {
        **COMMON, "num_layers": 4, "learning_rate": 0.001975213597736287, "l2_penalty": 5.853555404849184e-05,
        "input_embedding_ratio": 1.0, "tie_embeddings": False, "softmax_components": 1,
        "input_dropout": 0.1233672355450206, "inter_layer_dropout": 0.12636500626697247,
        "state_dropout": 0.13063181510547955, "output_dropout": 0.24846692818769148},
    "e81db31261c0+_tune_enwik8_96m_lstm_fm_d4_arms_MtngW/trial_216": {
        **COMMON, "num_layers": 4, "learning_rate": 0.0022480107672343715, "l2_penalty": 4.409390792135428e-05,
        "input_embedding_ratio": 1.0, "tie_embeddings": False, "softmax_components": 1,
        "input_dropout": 0.015908852824256536, "inter_layer_dropout": 0.13785990907975867,
        "state_dropout": 0.1648727901535727, "output_dropout": 0.2878539844807166,
        "mogrifier_rounds": 5, "mogrifier_rank": 61},
    "0393c7dc3532+_tune_ptb_char_24m_lstm_fm_d2_asgd_ts150/trial_596": {
        **COMMON, "learning_rate": 0.003739598828019367, "l2_penalty": 0.00025558089199237096,
        "input_embedding_ratio": 1.0, "tie_embeddings": False, "softmax_components": 1,
        "input_dropout": 0.27860252841733274, "inter_layer_dropout": 0.0737609984911853,
        "state_dropout": 0.17118611234551975, "output_dropout": 0.2347428361918374,
        "mogrifier_rounds": 4, "mogrifier_rank": 24},
}
BY_STUDY = {reference.study: reference for reference in REFERENCE_CONFIGURATIONS}


@pytest.mark.parametrize("study", list(EXPECTED))
def test_each_reference_configuration_maps_to_our_hyperparameters_value_for_value(study):
    reference = BY_STUDY[study]
    values = mapped_values(reference)
    assert values == EXPECTED[study]
    assert {name: type(value) for name, value in values.items()} == {
        name: type(value) for name, value in EXPECTED[study].items()}  # 5 rounds, not 5.0; true, not 1
    assert reference.path == f"lamb/experiment/mogrifier/config/{study}/config"
    assert reference.source.startswith("deepmind/lamb@254a0b0e330c ")


def test_every_reference_setting_is_mapped_or_said_to_have_none():
    converted = {"share_input_and_output_embeddings", "mos_num_components", "feature_mask_rounds",
                 "feature_mask_rank"}
    for reference in REFERENCE_CONFIGURATIONS:
        assert set(reference.settings) <= set(SAME_NAME) | converted | set(NO_COUNTERPART), reference.study
    assert set(NO_COUNTERPART).isdisjoint(SAME_NAME)


def test_the_published_families_and_tasks():
    published = {(reference.task, reference_family(reference), reference.parameters)
                 for reference in REFERENCE_CONFIGURATIONS}
    assert published == {("ptb", "lstm", 24_000_000), ("ptb", "mogrifier", 24_000_000),
                         ("wikitext-2", "lstm", 35_000_000), ("wikitext-2", "mogrifier", 35_000_000),
                         ("enwik8", "lstm", 48_000_000), ("enwik8", "mogrifier", 48_000_000),
                         ("enwik8", "lstm", 96_000_000), ("enwik8", "mogrifier", 96_000_000),
                         ("ptb-char", "mogrifier", 24_000_000)}
    assert TASKS["ptb"].train_tokens == PTB_SPLIT_TOKENS[0]
    passes = {reference.task: reference.training_tokens / TASKS[reference.task].train_tokens
              for reference in REFERENCE_CONFIGURATIONS}
    assert round(passes["ptb"]) == 964  # thesis §2.3.1: "964 epochs"
    assert (round(passes["wikitext-2"]), round(passes["enwik8"]), round(passes["ptb-char"])) == (429, 28, 191)


def test_the_scale_is_one_at_the_references_own_training_and_never_more():
    assert regularisation_scale(964.0, 24_000_000, 964.0, 24_000_000) == 1.0
    assert regularisation_scale(2000.0, 96_000_000, 964.0, 24_000_000) == 1.0


def test_the_scale_follows_the_rule():
    # min(1, ln(1 + E N / N_ref) / ln(1 + E_ref)): 8 epochs at 24M, and 1.3 passes at 4M, against PTB's 964 at 24M
    assert regularisation_scale(8.0, 24_000_000, 964.0, 24_000_000) == pytest.approx(math.log(9) / math.log(965))
    assert regularisation_scale(1.3, 4_000_000, 964.0, 24_000_000) == pytest.approx(
        math.log(1 + 1.3 / 6) / math.log(965))
    scales = [regularisation_scale(passes, 4_000_000, 964.0, 24_000_000) for passes in (0.1, 1, 10, 100)]
    assert scales == sorted(scales) and scales[0] < 0.01  # a fraction of a pass: almost no regularisation
    assert regularisation_scale(1.0, 1_000_000, 964.0, 24_000_000) < regularisation_scale(1.0, 4_000_000, 964.0,
                                                                                           24_000_000)


def test_scaling_shrinks_the_regularisers_and_keeps_the_rest():
    published = EXPECTED["786252db3825+_tune_ptb_24m_lstm_fm_d2_arms/trial_483"]
    scaled = scaled_values(published, 0.25, parameter_ratio=1 / 16)
    for name in ("input_dropout", "inter_layer_dropout", "state_dropout", "output_dropout", "l2_penalty"):
        assert scaled[name] == published[name] * 0.25
    for name in ("learning_rate", "input_embedding_ratio", "num_layers", "mogrifier_rounds", "tie_embeddings"):
        assert scaled[name] == published[name]
    assert scaled["mogrifier_rank"] == 21  # 84 x sqrt(1/16)
    assert (scaled_rank(84, 1e-6), scaled_rank(0, 1e-6), scaled_rank(-5, 4.0), scaled_rank(48, 4.0)) == (1, 0, -5, 96)


def test_values_are_clipped_into_the_searched_ranges_and_the_rest_left_out():
    ranges = {"learning_rate": SearchRange(low=0.001, high=0.002, log=True),
              "mogrifier_rounds": SearchRange(low=1, high=4),
              "input_dropout": SearchRange(low=0.0, high=0.9),
              "softmax_components": SearchRange(choices=[1, 3]),
              "tie_embeddings": SearchRange(choices=[False])}
    values = {"learning_rate": 0.0023, "mogrifier_rounds": 5, "input_dropout": 0.5, "softmax_components": 2.4,
              "tie_embeddings": True, "state_dropout": 0.3}
    kept, notes = clipped_into(values, ranges)
    assert kept == {"learning_rate": 0.002, "mogrifier_rounds": 4, "input_dropout": 0.5, "softmax_components": 3}
    assert type(kept["mogrifier_rounds"]) is int
    assert notes == ["learning_rate 0.0023 clipped to 0.002, into the study's range 0.001-0.002",
                     "mogrifier_rounds 5 clipped to 4, into the study's range 1-4",
                     "softmax_components 2.4 moved to 3, the nearest of the study's choices",
                     "tie_embeddings true left out: not among the study's choices"]


@pytest.mark.parametrize(("space", "family", "study"), [
    ("ptb_comparison", "lstm", "786252db3825+_tune_ptb_24m_lstm_d2_arms/trial_833"),
    ("ptb_comparison", "mogrifier", "786252db3825+_tune_ptb_24m_lstm_fm_d2_arms/trial_483"),
    ("mogrifier_wt2", "mogrifier", "c51c838b33a5+_tune_wikitext-2_35m_lstm_mos2_fm_d2_arms/trial_747"),
    ("mogrifier_enwik8", "mogrifier", "4d0a9a5bdb04+_tune_enwik8_48m_lstm_fm_d4_arms/trial_234"),
    ("mogrifier_ptb_char", "mogrifier", "0393c7dc3532+_tune_ptb_char_24m_lstm_fm_d2_asgd_ts150/trial_596"),
])
def test_a_full_size_space_starts_from_the_published_values_themselves(space, family, study):
    spec = load_spec(SPACES / f"{space}.yaml")
    prior = family_prior(spec, family)
    assert prior.scale == 1.0 and prior.stands_in is None and prior.notes == []
    assert prior.source == BY_STUDY[study].source
    assert prior.values == {name: value for name, value in EXPECTED[study].items() if name in spec.search_space}


def test_of_several_budgets_the_nearest_is_taken():
    document = yaml.safe_load((SPACES / "mogrifier_enwik8.yaml").read_text())
    assert "_96m_" in family_prior(parse_spec({**document, "parameter_budget": 90_000_000}), "mogrifier").source
    assert "_48m_" in family_prior(parse_spec({**document, "parameter_budget": 60_000_000}), "mogrifier").source


def test_a_family_without_a_published_configuration_has_none_said_plainly():
    prior = family_prior(load_spec(SPACES / "rlstm_ptb.yaml"), "rlstm")
    assert prior.values == {} and prior.none_because == "deepmind/lamb publishes no rlstm configuration for PTB words"
    document = yaml.safe_load((SPACES / "mogrifier_ptb_char.yaml").read_text())
    lstm = family_prior(parse_spec({**document, "families": ["lstm", "mogrifier"]}), "lstm")
    assert lstm.none_because == "deepmind/lamb publishes no lstm configuration for PTB characters"


@pytest.mark.parametrize(("dataset", "task"), [
    ({"path": "/corpus", "format": "text", "level": "word"}, "PTB words"),
    ({"path": "/corpus", "format": "text", "level": "char"}, "PTB characters"),
    ({"name": "text8"}, "PTB characters"),
    ({"name": "wikitext-103"}, "PTB words"),
    (TINY_SPEC["dataset"], "PTB words"),
])
def test_another_corpus_takes_the_closest_task_by_level_and_says_so(dataset, task):
    spec = parse_spec({**TINY_SPEC, "dataset": dataset})
    prior = family_prior(spec, "mogrifier")  # PTB characters have no published LSTM
    assert prior.reference.startswith(f"{task}, 24M") and f"{task}, the closest by level, stands in" in prior.stands_in


def test_the_studys_training_in_passes():
    tiny = parse_spec(TINY_SPEC)  # 3 turns x 4 steps x 8 x 10 tokens over a 6,000-token training split
    assert study_training(tiny, "lstm", TASKS["ptb"]).passes == pytest.approx(960 / 6000)
    on_disk = parse_spec({**TINY_SPEC, "dataset": {"path": "/corpus", "format": "text"}})
    training = study_training(on_disk, "lstm", TASKS["ptb"])  # its size is not known yet: PTB's stands in
    assert training.passes == pytest.approx(960 / 929_589) and "taken as large as PTB words" in training.said
    epochs = parse_spec({**TINY_SPEC, "training": {"budget_epochs": 2.5, "batch_size": 8, "bptt": 10}})
    assert study_training(epochs, "lstm", TASKS["ptb"]).passes == 2.5
    seconds = {**TINY_SPEC, "training": {"budget_seconds": 60, "batch_size": 8, "bptt": 10}}
    wall = study_training(parse_spec(seconds), "lstm", TASKS["ptb"])
    process = study_training(parse_spec({**seconds, "training": {**seconds["training"], "clock": "process"},
                                         "resources": {"cpus_per_trial": 2}}), "lstm", TASKS["ptb"])
    assert wall.passes > 0 and "tokens in 60 s at the speed measured on" in wall.said
    assert study_training(parse_spec(seconds), "lstm", TASKS["ptb"]) == wall  # the same wherever it is made
    assert process.passes < 2 * wall.passes  # 60 s of two cores' CPU time is 30 s of wall time


def test_priors_are_off_unless_the_spec_turns_them_on_and_left_out_of_its_dump():
    spec = parse_spec(TINY_SPEC)
    assert not spec.tuning.priors and prior_points(spec, "lstm") == []
    assert "priors" not in spec.model_dump(mode="json")["tuning"]  # studies stored before it dump as they were
    on = parse_spec({**TINY_SPEC, "tuning": {**TINY_SPEC["tuning"], "priors": True}})
    assert on.model_dump(mode="json")["tuning"]["priors"] is True  # the study records it
    assert parse_spec(on.model_dump(mode="json")) == on


def test_the_priors_come_after_the_specs_own_initial_points():
    tuning = {**TINY_SPEC["tuning"], "priors": True, "initial_points": [{"learning_rate": 0.005}]}
    spec = parse_spec({**TINY_SPEC, "tuning": tuning})
    assert initial_points(spec, "lstm") == [{"learning_rate": 0.005}, {"learning_rate": 0.0030369099569192135}]
    # the tiny spec searches the learning rate and rounds 1-4: the Mogrifier's 5 rounds are clipped to 4
    assert initial_points(spec, "mogrifier") == [{"learning_rate": 0.005},
                                                 {"learning_rate": 0.002299987130225388, "mogrifier_rounds": 4}]
    assert family_prior(spec, "mogrifier").notes == ["mogrifier_rounds 5 clipped to 4, into the study's range 1-4"]


def test_every_shipped_space_starts_from_the_priors():
    for path in sorted(SPACES.glob("*.yaml")):
        assert load_spec(path).tuning.priors, path.name


def test_under_a_compute_budget_the_training_is_the_top_rungs():
    budgeted = {**TINY_SPEC, "training": {"steps_per_turn": 4, "batch_size": 8, "bptt": 10, "eval_batch_size": 4},
                "tuning": {"sampler": "gp", "concurrency": 2}}
    small, large = (study_training(parse_spec({**budgeted, "compute_budget": {"core_hours": hours}}), "lstm",
                                   TASKS["ptb"]) for hours in (0.01, 0.02))
    assert small.said.startswith("the top rung's ") and "(compute_budget, at the speed measured on " in small.said
    assert large.passes == pytest.approx(2 * small.passes, rel=0.01)  # twice the budget: twice the top rung
