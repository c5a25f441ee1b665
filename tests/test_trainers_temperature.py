"""The softmax temperature search as the reference runs it (a grid walked from 1.06 down, stopping after two
values without improvement), done in one pass, and the per-turn objective at the chosen temperature."""

from __future__ import annotations

import math

import pytest
import torch

from lm_tuner.models import ModelConfig
from lm_tuner.trainers import (
    MarkovCorpusConfig,
    Schedule,
    TrainingConfig,
    load_corpus,
    monte_carlo_cross_entropy,
    search_logit_scale,
    searched_monte_carlo_cross_entropy,
    searched_streams_cross_entropy,
)
from lm_tuner.trainers.averaging_protocol import Evaluated
from lm_tuner.trainers.batching import batchify
from lm_tuner.trainers.evaluation import LOGIT_SCALES, streams_cross_entropy
from lm_tuner.trainers.temperature import patience_search
from lm_tuner.trainers.training_run import TrainingRun
from lm_tuner.trainers.weight_swap import swapped_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # numbers independent of the thread count

CPU = torch.device("cpu")
BPTT = 10


def reference_search(loss_at) -> tuple[float, dict[float, float]]:
    """deepmind/lamb evaluation.evaluate_all: one evaluation per value, `if best_i+1 < i: break`."""
    best_loss, best_i, chosen, tried = 99999999.0, 0, None, {}
    for i, scale in enumerate(LOGIT_SCALES):
        tried[scale] = loss_at(scale)
        if tried[scale] < best_loss:
            best_i, best_loss, chosen = i, tried[scale], scale
        if best_i + 1 < i:
            break
    return chosen, tried


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(MarkovCorpusConfig(vocab_size=24, train_tokens=6000, valid_tokens=1200, test_tokens=600))


def training_run(corpus, search_temperature: bool = True, dropout: float = 0.0) -> TrainingRun:
    model_config = ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=16, num_layers=1,
                               input_dropout=dropout, output_dropout=dropout)
    schedule = Schedule(turns=3, steps_per_turn=30, batch_size=8, bptt=BPTT, eval_batch_size=4,
                        search_temperature=search_temperature)
    return TrainingRun(model_config, TrainingConfig(schedule=schedule, learning_rate=0.01), corpus, CPU)


@pytest.fixture(scope="module")
def trained(corpus):
    """A model with dropout, trained for a turn."""
    run = training_run(corpus, dropout=0.3)
    run.train_turn()
    return run.model.eval()


@pytest.mark.parametrize("losses, chosen, tried", [
    ([3.0, 2.0, 1.0, 2.0, 3.0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0], 1.02, 5),  # a later, better value is never reached
    ([1.0, 2.0, 3.0] + [0.0] * 11, 1.06, 3),
    ([1.0, 2.0, 0.5, 0.7, 0.4, 0.6, 0.5] + [9.0] * 7, 0.98, 7),  # one miss, then a better value: the count restarts
    ([1.0, 1.0, 1.0] + [0.0] * 11, 1.06, 3),  # a tie is no improvement
    ([float(14 - i) for i in range(14)], 0.8, 14),  # improving all the way: the whole grid
])
def test_the_patience_rule_is_the_references(losses, chosen, tried) -> None:
    search = patience_search(losses)
    expected_scale, expected_tried = reference_search(dict(zip(LOGIT_SCALES, losses, strict=True)).__getitem__)
    assert (search.logit_scale, search.losses) == (expected_scale, expected_tried)
    assert search.logit_scale == chosen and len(search.losses) == tried
    assert search.loss == min(search.losses.values())


def test_nan_losses_choose_the_first_value_with_a_nan_loss() -> None:
    search = patience_search([math.nan] * 14)
    assert search.logit_scale == 1.06 and math.isnan(search.loss)  # reported as a divergence, never as a number


@pytest.mark.parametrize("batch_size, tokens", [(1, 100), (4, 200), (4, 10**6)])
def test_one_pass_search_equals_the_sequential_search(corpus, trained, batch_size, tokens) -> None:
    batched = batchify(corpus.valid, batch_size)
    windows = max(1, tokens // (batch_size * BPTT))
    first = batched[: windows * BPTT + 1]  # the windows the search reads

    def loss_at(scale: float) -> float:
        return streams_cross_entropy(trained, first, BPTT, logit_scale=scale)

    chosen, tried = reference_search(loss_at)
    searched = searched_streams_cross_entropy(trained, batched, BPTT, tokens=tokens)
    assert searched.logit_scale == chosen
    assert searched.search.losses == pytest.approx(tried, rel=1e-12) and list(searched.search.losses) == list(tried)
    assert search_logit_scale(trained, corpus.valid, batch_size, BPTT, tokens=tokens) == searched.search
    assert searched.loss == streams_cross_entropy(trained, batched, BPTT, logit_scale=chosen)  # every token, exactly


def test_monte_carlo_search_equals_the_sequential_search_with_the_same_masks(corpus, trained) -> None:
    options = {"multiplier": 1.0, "samples": 3}
    windows = 10  # tokens=100 at batch size 1 and bptt 10

    def loss_at(scale: float) -> float:
        torch.manual_seed(0)
        return monte_carlo_cross_entropy(trained, corpus.valid[: windows * BPTT + 1], 1, BPTT, logit_scale=scale,
                                         **options)

    chosen, tried = reference_search(loss_at)
    torch.manual_seed(0)
    searched = searched_monte_carlo_cross_entropy(trained, corpus.valid, 1, BPTT, tokens=100, **options)
    assert searched.logit_scale == chosen
    assert searched.search.losses == pytest.approx(tried, rel=1e-12) and list(searched.search.losses) == list(tried)
    torch.manual_seed(0)
    whole = monte_carlo_cross_entropy(trained, corpus.valid, 1, BPTT, logit_scale=chosen, **options)
    assert searched.loss == pytest.approx(whole, rel=1e-12)


def test_monte_carlo_search_carries_each_group_of_samples_across_the_search(corpus, trained) -> None:
    deterministic = searched_streams_cross_entropy(trained, batchify(corpus.valid, 2), BPTT, tokens=100)
    for max_rows in (2, 4, 64):  # samples in groups of 1, 2 and all 3
        mc = searched_monte_carlo_cross_entropy(trained, corpus.valid, 2, BPTT, multiplier=0.0, samples=3,
                                                tokens=100, max_rows=max_rows)
        assert mc.logit_scale == deterministic.logit_scale
        assert mc.loss == pytest.approx(deterministic.loss, rel=1e-6)
    assert not trained.training  # the mode it had before


def test_objective_without_the_search_is_the_loss_at_temperature_one(corpus) -> None:
    run = training_run(corpus, search_temperature=False)
    run.train_turn()
    evaluated = run.evaluate()
    assert evaluated.logit_scale == 1.0
    assert evaluated.loss == streams_cross_entropy(run.model, batchify(corpus.valid, 4), BPTT)


def test_objective_with_the_search_is_the_loss_at_the_chosen_temperature(corpus) -> None:
    run = training_run(corpus)
    run.train_turn()
    evaluated = run.evaluate()
    at_one = streams_cross_entropy(run.model, run.validation, BPTT)
    searched = searched_streams_cross_entropy(run.model, run.validation, BPTT)
    assert evaluated.logit_scale == searched.logit_scale != 1.0
    assert evaluated.loss == searched.loss == streams_cross_entropy(run.model, run.validation, BPTT,
                                                                    logit_scale=searched.logit_scale) < at_one


def test_the_search_reads_the_first_windows_of_the_validation_subset(corpus) -> None:
    run = training_run(corpus)
    subset = Schedule(**{**run.schedule.model_dump(), "validation_tokens": 400})
    run = TrainingRun(run.model_config, TrainingConfig(schedule=subset, learning_rate=0.01), corpus, CPU)
    run.train_turn()
    evaluated = run.evaluate()
    batched = batchify(corpus.valid[:400], 1)  # one stream: a subset is cut into streams of at least 2,500 tokens
    assert evaluated.loss == searched_streams_cross_entropy(run.model, batched, BPTT).loss
    assert run.validation_tokens == 399 < 50_000  # the subset is shorter than the search: it searches all of it


class ScoresTwoReportsOne:
    """A strategy that scores the initial weights, then the raw ones, and reports the `reported`-th of them."""

    def __init__(self, initial: list[torch.Tensor], reported: int) -> None:
        self.initial, self.reported = initial, reported

    def add(self, weights) -> None:
        pass

    def evaluate(self, raw, loss_of, progress: float) -> Evaluated:
        candidates = [self.initial, raw]
        losses = [loss_of(weights) for weights in candidates]
        return Evaluated(losses[self.reported], candidates[self.reported], 1)


def test_the_reported_temperature_is_the_one_chosen_for_the_reported_weights(corpus) -> None:
    run = training_run(corpus)
    initial = [tensor.detach().clone() for tensor in run.params]
    run.train_turn()
    scales = []
    for reported in (0, 1):
        run.averaging = ScoresTwoReportsOne(initial, reported)
        scales.append(run.evaluate().logit_scale)
    assert scales[1] == searched_streams_cross_entropy(run.model, run.validation, BPTT).logit_scale
    with swapped_weights(run.model, initial):
        assert scales[0] == searched_streams_cross_entropy(run.model, run.validation, BPTT).logit_scale
    assert scales[0] != scales[1]  # the untrained and trained weights prefer different temperatures
