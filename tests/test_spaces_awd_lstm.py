"""The AWD-LSTM spaces: the full one's first trial is the paper's model, the CPU-sized twin plans and runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lm_tuner.models import count_parameters
from lm_tuner.tuner.spec import load_spec
from lm_tuner.tuner.spec.plan import plan_study
from lm_tuner.tuner.spec.space import initial_points, trial_setup
from tests.test_cli import tuner

SPACES = Path(__file__).parent.parent / "spaces"


def test_the_first_trial_of_the_full_space_is_the_papers_model():
    spec = load_spec(SPACES / "awd_lstm_ptb.yaml")
    (point,) = initial_points(spec, "awd_lstm")
    setup = trial_setup(spec, "awd_lstm", point, vocab_size=10_000, seed=0)
    model, schedule = setup.model, setup.training.schedule
    assert (model.num_layers, model.hidden_size, model.embedding_size) == (3, 1150, 400)
    assert count_parameters(model) == spec.parameter_budget == 24_210_800
    assert (model.weight_drop, model.ar_alpha, model.tar_beta) == (0.5, 2.0, 1.0)
    assert (model.input_dropout, model.inter_layer_dropout, model.output_dropout, model.embedding_dropout) == (
        0.4, 0.3, 0.4, 0.1)
    assert not model.cap_input_gate and model.tie_embeddings and setup.training.l2_penalty == 1.2e-6
    assert (schedule.batch_size, schedule.bptt, schedule.variable_bptt, schedule.averaging.kind) == (
        40, 70, True, "nt-asgd")


def test_the_small_twin_is_planned_within_its_budget():
    spec = load_spec(SPACES / "small" / "awd_lstm_ptb.yaml")
    (planned,) = plan_study(spec, vocab_size=40).families
    assert planned.family == "awd_lstm" and planned.infeasible_points == 0
    assert planned.parameters["total"] <= spec.parameter_budget


@pytest.mark.slow
def test_tuner_plans_the_small_twin(tmp_path):
    planned = tuner("plan", "--space", "small/awd_lstm_ptb", "--no-probe", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert "family awd_lstm" in planned.stdout and "hidden size min / median / max" in planned.stdout
