"""The test protocol's Monte-Carlo dropout as the reference runs it: each multiplier 0.6, 0.7, 0.8 and 0.9 with its
own temperature searched by MC evaluation, the multiplier chosen on validation and reported with its test score."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from lm_tuner.models import ModelConfig
from lm_tuner.trainers import (
    MC_MULTIPLIERS,
    MarkovCorpusConfig,
    Schedule,
    TrainingConfig,
    evaluate_checkpoint,
    load_checkpoint,
    load_corpus,
    monte_carlo_cross_entropy,
    searched_monte_carlo_cross_entropy,
    train,
)
from lm_tuner.trainers.evaluation import LOGIT_SCALES
from lm_tuner.tuner.spec.document import Evaluation

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # numbers independent of the thread count

BPTT = 25


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small model with dropout, trained a little; its corpus and best checkpoint's path."""
    corpus = load_corpus(MarkovCorpusConfig(vocab_size=24, train_tokens=6000, valid_tokens=500, test_tokens=500))
    model_config = ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=16, num_layers=1,
                               input_dropout=0.4, state_dropout=0.4, output_dropout=0.4)
    path = tmp_path_factory.mktemp("trained") / "best.pt"
    config = TrainingConfig(schedule=Schedule(turns=2, steps_per_turn=30, batch_size=16, bptt=20), learning_rate=0.01)
    train(model_config, config, corpus, checkpoint_path=path, device=torch.device("cpu"))
    return corpus, path


def test_the_multiplier_is_chosen_on_validation_and_reported_with_its_test_score(trained) -> None:
    corpus, path = trained
    torch.manual_seed(0)
    result = evaluate_checkpoint(path, corpus, bptt=BPTT, mc_samples=3)
    torch.manual_seed(0)
    model = load_checkpoint(path).model  # (as the protocol does: building the model draws from the generator)
    expected = []
    for multiplier in MC_MULTIPLIERS:  # each with its own temperature, searched under MC at that multiplier
        valid = searched_monte_carlo_cross_entropy(model, corpus.valid, 1, BPTT, multiplier=multiplier, samples=3)
        test = monte_carlo_cross_entropy(model, corpus.test, 1, BPTT, multiplier=multiplier, samples=3,
                                         logit_scale=valid.logit_scale)
        expected.append((multiplier, valid.logit_scale, valid.loss, test))
    assert [(mc.multiplier, mc.logit_scale, mc.valid, mc.test) for mc in result.mc_by_multiplier] == expected
    best = min(result.mc_by_multiplier, key=lambda mc: mc.valid)
    assert (result.mc_multiplier, result.mc_logit_scale) == (best.multiplier, best.logit_scale)
    assert (result.mc_valid, result.mc_test) == (best.valid, best.test)
    assert all(mc.logit_scale in LOGIT_SCALES for mc in result.mc_by_multiplier)
    assert len({mc.valid for mc in result.mc_by_multiplier}) == len(MC_MULTIPLIERS)  # the choice is a real one


def test_without_the_search_every_evaluation_is_at_temperature_one(trained) -> None:
    corpus, path = trained
    result = evaluate_checkpoint(path, corpus, bptt=BPTT, search_temperature=False, mc_samples=2,
                                 mc_multipliers=(0.5, 0.0))
    assert result.logit_scale == result.mc_logit_scale == 1.0
    assert [mc.multiplier for mc in result.mc_by_multiplier] == [0.5, 0.0]
    assert result.mc_multiplier in (0.5, 0.0)


def test_no_monte_carlo_samples_no_monte_carlo_result(trained) -> None:
    corpus, path = trained
    result = evaluate_checkpoint(path, corpus, bptt=BPTT)
    assert result.mc_valid is result.mc_multiplier is None and result.mc_by_multiplier == ()
    with pytest.raises(ValueError, match="mc_multipliers"):
        evaluate_checkpoint(path, corpus, bptt=BPTT, mc_samples=2, mc_multipliers=())


def test_the_spec_tries_the_references_multipliers_unless_given_one_or_a_list() -> None:
    assert Evaluation().mc_multipliers == MC_MULTIPLIERS == (0.6, 0.7, 0.8, 0.9)
    assert Evaluation(mc_multiplier=0.8).mc_multipliers == (0.8,)
    assert Evaluation(mc_multiplier=0.8).model_dump()["mc_multiplier"] == 0.8  # a spec stored with one dumps as it was
    assert Evaluation(mc_multiplier=[0.5, 1]).mc_multipliers == (0.5, 1)
    for wrong in ([], [0.5, 1.5], -0.1, True, "0.8", [None]):
        with pytest.raises(ValidationError, match="mc_multiplier"):
            Evaluation(mc_multiplier=wrong)
