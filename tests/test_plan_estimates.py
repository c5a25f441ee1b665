"""`tuner plan`'s evaluation estimate against what a real trial's turns record: the probe times the evaluation a
turn runs (the softmax temperature search on the turn's validation streams included), not a cheaper stand-in."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from lm_tuner.trainers import load_corpus
from lm_tuner.trainers.training import train
from lm_tuner.tuner.run import probe
from lm_tuner.tuner.run.probe import PassCost, ValidationLayout, study_plan
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.space import trial_setup

# A vocabulary large enough for the temperature search's grid to cost more than the forward passes, and a validation
# subset scored as one long stream: the two costs a one-window-per-stream probe without the search left out.
SEARCHED_SUBSET = {
    "name": "estimates",
    "dataset": {"generator": "markov", "vocab_size": 2000, "order": 1, "train_tokens": 20000, "valid_tokens": 12000,
                "test_tokens": 1200},
    "families": ["lstm"],
    "parameter_budget": 60000,
    "training": {"turns": 4, "steps_per_turn": 2, "batch_size": 8, "bptt": 10, "eval_batch_size": 16,
                 "validation_tokens": 2000},
    "fixed": {"num_layers": 1, "tie_embeddings": True, "input_embedding_ratio": 1.0},
    "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
    "tuning": {"sampler": "random", "trials": 1, "concurrency": 1},
}


@pytest.mark.serial
def test_the_evaluation_estimate_is_within_a_factor_of_a_real_trial_s(one_torch_thread):
    spec = parse_spec(SEARCHED_SUBSET)
    assert spec.training.search_temperature  # the default: every turn searches
    (family,) = study_plan(spec, probe=True, seconds=3).families
    corpus = load_corpus(spec.dataset)
    setup = trial_setup(spec, "lstm", family.median_point, len(corpus.vocabulary), seed=0)
    turns = train(setup.model, setup.training, corpus, device=torch.device("cpu")).turns
    assert all(turn.val_subset for turn in turns)
    # The least, as the probe keeps the least of its tries: both then time the machine at its quietest. A median
    # counts the slow spells of a loaded machine (stray processes of earlier tests) on one side only: 1.7x in CI.
    measured = min(turn.eval_seconds for turn in turns)
    estimated = family.estimate.evaluation_seconds
    assert measured / 1.6 <= estimated <= measured * 1.6, (estimated, measured)


def test_a_turns_evaluation_scales_its_passes_with_the_windows_and_its_other_costs_not():
    layout = ValidationLayout(streams=1, windows=200, searched=50)
    plain, searched = PassCost(fixed=0.002, per_window=0.001), PassCost(fixed=0.003, per_window=0.004)
    probed_pass = searched.seconds(layout.probed_windows)
    real_pass = searched.seconds(50) + plain.per_window * 150
    for passes in (1, 2):
        # swapping weights and the averaging's bookkeeping: 5 ms a turn, the same on 4 windows as on 200
        turn = layout.turn_seconds(passes * probed_pass + 0.005, passes, plain, searched, extra_passes=0)
        assert turn == pytest.approx(passes * real_pass + 0.005)
    assert layout.turn_seconds(0.5 * probed_pass, 1, plain, searched, extra_passes=1) == \
        pytest.approx(real_pass + plain.seconds(200))


@pytest.mark.parametrize(("pass_seconds", "budget", "tries"), [(0.0, 5.0, 5), (0.1, 0.01, 1), (0.1, 0.7, 3)])
def test_the_pass_timings_stop_where_another_try_would_outlast_their_share(monkeypatch, pass_seconds, budget, tries):
    """A 24M-parameter model on a CPU took 10 s a try: five tries each, with and without the temperature search,
    made a 10-second probe last 132 s."""
    passes = []

    def scored(model, streams, bptt):
        passes.append(streams.shape[0])
        time.sleep(pass_seconds)

    monkeypatch.setattr(probe, "streams_cross_entropy", scored)
    run = SimpleNamespace(schedule=SimpleNamespace(bptt=4), validation=torch.zeros(13, 2), model=None)
    cost = probe._pass_cost(run, searched=False, seconds=budget)
    assert passes == [5, 13] * tries and cost.per_window >= 0


def test_steps_are_timed_after_warming_up_and_on_a_gpu_never_on_the_first():
    """On an H200 the probe timed a 24M LSTM's step at 3.2 s, its first (Triton kernels built, CUDA graphs captured):
    a real trial's steps took 37 ms, and the study's plan found its 3-minute budget 90x too small."""

    def action(durations):
        runs = iter(durations)
        return lambda: time.sleep(next(runs))

    # a GPU: untimed while a step captures graphs (here the first three), then the steady steps, the first included
    captures = iter([True, True, False])
    timed = probe._timed(action([0.3, 0.2, 0.2, 0.01] + [0.01] * 60), 0.05, warming=lambda: next(captures, False))
    assert timed and max(timed) < 0.1
    # a slow first step on a GPU is never the measurement, also where it outlasts the time
    assert max(probe._timed(action([0.3] + [0.01] * 60), 0.05, warming=lambda: False)) < 0.1
    # a CPU: a first step that outlasts the time is measured (a shape too slow to run twice); else it is left out
    assert probe._timed(action([0.1, 0.01]), 0.05) == [pytest.approx(0.1, abs=0.05)]
    assert max(probe._timed(action([0.04] + [0.001] * 60), 0.05)) < 0.03
