"""Cheap, honest evaluation while tuning: a fixed validation subset each turn, the best checkpoints rescored on
the whole split, the seconds spent training and evaluating, and a warning when evaluation dominates."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import yaml
from pydantic import ValidationError
from sqlalchemy import select

from lm_tuner.models import ModelConfig
from lm_tuner.trainers import (
    MarkovCorpusConfig,
    Schedule,
    TrainingConfig,
    cross_entropy,
    load_checkpoint,
    load_corpus,
    searched_streams_cross_entropy,
    train,
)
from lm_tuner.trainers.batching import batchify
from lm_tuner.trainers.training_run import TrainingRun
from lm_tuner.trainers.validation_cut import subset_streams
from lm_tuner.tuner.run.controller import connect_ray, launch_study
from lm_tuner.tuner.run.recorder import StudyRecorder
from lm_tuner.tuner.run.stages import run_full_validations
from lm_tuner.tuner.run.trial import checkpoint_relative_path
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.estimate import validation_tokens_per_turn
from lm_tuner.tuner.store.documents import TrialOut
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.schema import TrialRecord, TurnRecord
from lm_tuner.tuner.store.trials import get_trial, top_trials
from tests.conftest import TINY_SPEC

CPU = torch.device("cpu")
SCHEDULE = {"turns": 3, "steps_per_turn": 4, "batch_size": 8, "bptt": 10, "eval_batch_size": 4}


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(MarkovCorpusConfig(vocab_size=24, train_tokens=6000, valid_tokens=1000, test_tokens=600))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # numbers independent of the thread count


def model_of(corpus) -> ModelConfig:
    return ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=16, num_layers=1)


def test_a_subset_must_hold_a_window_for_every_evaluation_stream() -> None:
    with pytest.raises(ValidationError, match=r"validation_tokens: got 43; allowed: at least eval_batch_size x "
                                              r"\(bptt \+ 1\) = 44"):
        Schedule(**SCHEDULE, validation_tokens=43)
    assert Schedule(**SCHEDULE, validation_tokens=44).validation_tokens == 44


def test_an_unset_subset_is_left_out_of_a_dumped_schedule_so_stored_specs_stay_identical() -> None:
    assert "validation_tokens" not in Schedule(**SCHEDULE).model_dump()
    dumped = Schedule(**SCHEDULE, validation_tokens=500).model_dump()
    assert dumped["validation_tokens"] == 500 and Schedule(**dumped) == Schedule(**SCHEDULE, validation_tokens=500)


def test_each_turn_scores_exactly_the_first_n_validation_tokens(corpus, tmp_path) -> None:
    config = TrainingConfig(schedule=Schedule(**SCHEDULE, validation_tokens=300), learning_rate=0.01)
    result = train(model_of(corpus), config, corpus, checkpoint_path=tmp_path / "best.pt", device=CPU)
    assert all(turn.val_subset and turn.val_tokens == 300 - 1 for turn in result.turns)  # one stream: see below
    best = load_checkpoint(tmp_path / "best.pt")
    assert best.metadata["val_subset"] and best.metadata["val_tokens"] == 299
    logit_scale = result.turns[result.best_turn - 1].val_logit_scale  # the temperature chosen on those tokens
    on_subset = cross_entropy(best.model, corpus.valid[:300], 1, 10, logit_scale=logit_scale)
    assert best.metadata["val_loss"] == result.best_val_loss == pytest.approx(on_subset, rel=1e-12)
    assert cross_entropy(best.model, corpus.valid, 4, 10, logit_scale=logit_scale) != pytest.approx(
        on_subset, rel=1e-6)  # not all of it


def test_a_subset_is_scored_in_streams_of_at_least_2500_tokens() -> None:
    assert [subset_streams(tokens, 32) for tokens in (300, 2_499, 2_500, 10_000, 79_999, 80_000, 10**6)] == [
        1, 1, 1, 4, 31, 32, 32]
    assert subset_streams(10_000, 2) == 2  # never more than eval_batch_size
    corpus = load_corpus(MarkovCorpusConfig(vocab_size=24, train_tokens=2000, valid_tokens=9000, test_tokens=100))
    for validation_tokens, streams in ((5_000, 2), (None, 4)):  # the whole split: eval_batch_size streams
        schedule = Schedule(**SCHEDULE, validation_tokens=validation_tokens)
        run = TrainingRun(model_of(corpus), TrainingConfig(schedule=schedule), corpus, CPU)
        assert run.validation.shape[1] == streams
        assert run.validation_tokens == validation_tokens_per_turn(schedule, 9000)


def test_without_a_subset_or_with_one_as_large_as_the_split_every_token_is_scored(corpus) -> None:
    for validation_tokens in (None, corpus.valid.numel()):
        config = TrainingConfig(schedule=Schedule(**SCHEDULE | {"turns": 1}, validation_tokens=validation_tokens))
        (turn,) = train(model_of(corpus), config, corpus, device=CPU).turns
        assert not turn.val_subset and turn.val_tokens == (corpus.valid.numel() // 4 - 1) * 4


def test_every_turn_reports_its_seconds_of_training_and_of_evaluation(corpus) -> None:
    result = train(model_of(corpus), TrainingConfig(schedule=Schedule(**SCHEDULE)), corpus, device=CPU)
    for turn in result.turns:
        assert turn.train_seconds > 0 and turn.eval_seconds > 0
    assert sum(t.train_seconds + t.eval_seconds for t in result.turns) <= result.turns[-1].wall_seconds


def test_turns_report_their_checkpoint_writes_and_the_first_one_the_set_up(corpus, tmp_path) -> None:
    config = TrainingConfig(schedule=Schedule(**SCHEDULE))
    without = train(model_of(corpus), config, corpus, device=CPU).turns
    saved = train(model_of(corpus), config, corpus, device=CPU, checkpoint_path=tmp_path / "best.pt",
                  latest_checkpoint_path=tmp_path / "latest.pt").turns
    assert all(turn.checkpoint_seconds > 0 for turn in saved)
    assert sum(t.checkpoint_seconds for t in without) < sum(t.checkpoint_seconds for t in saved)
    assert saved[0].setup_seconds > 0 and all(turn.setup_seconds == 0 for turn in saved[1:])


def turn_result(turn: int, *, train_seconds: float, eval_seconds: float) -> dict:
    return {"turn": turn, "step": 4 * turn, "train_loss": 3.0, "val_loss": 3.1, "best_val_loss": 3.1,
            "tokens_per_second": 1000.0, "wall_seconds": turn * (train_seconds + eval_seconds) + 0.1,
            "process_seconds": 1.0, "averaging_length": 1, "learning_rate": 0.01, "epochs": 0.1,
            "train_seconds": train_seconds, "eval_seconds": eval_seconds, "val_tokens": 296, "val_subset": False,
            "checkpoint_seconds": 0.25, "setup_seconds": 2.0 if turn == 1 else 0.0}


def test_the_recorder_keeps_the_seconds_and_warns_once_per_study_when_evaluation_dominates(storage_url, caplog,
                                                                                           monkeypatch) -> None:
    monkeypatch.setattr(StudyRecorder, "_warned_studies", set())
    ensure_schema(storage_url)
    with sessions(storage_url).begin() as session:
        session.add_all([TrialRecord(trial_id=trial_id, study_name="costly", family=family, number=0, seed=0)
                         for trial_id, family in ((1, "lstm"), (2, "mogrifier"))])
    recorder = StudyRecorder(storage_url)
    with caplog.at_level(logging.WARNING, logger="lm_tuner"):
        recorder.on_trial_result(1, [], SimpleNamespace(config={"optuna_trial_id": 1}),
                                 turn_result(1, train_seconds=3.0, eval_seconds=0.5))
        assert not caplog.records  # 14% of the time
        for trial_id in (1, 2):  # then 5.5 s of 9.5 s (58%), and 83% for the other
            recorder.on_trial_result(1, [], SimpleNamespace(config={"optuna_trial_id": trial_id}),
                                     turn_result(2, train_seconds=1.0, eval_seconds=5.0))
    (warning,) = caplog.records
    assert warning.levelno == logging.WARNING and warning.name == "lm_tuner"
    message = warning.getMessage()
    assert "'costly'" in message and "'lstm'" in message and "58%" in message
    assert "set training.validation_tokens" in message
    with sessions(storage_url)() as session:
        first = session.get(TrialRecord, 1)
        assert (first.train_seconds, first.eval_seconds, first.val_tokens, first.val_subset) == (4.0, 5.5, 296, False)
        turns = session.scalars(select(TurnRecord).where(TurnRecord.trial_id == 1).order_by(TurnRecord.turn)).all()
        assert [(t.train_seconds, t.eval_seconds) for t in turns] == [(3.0, 0.5), (1.0, 5.0)]
        assert [(t.checkpoint_seconds, t.setup_seconds) for t in turns] == [(0.25, 2.0), (0.25, 0.0)]


@pytest.mark.slow
def test_the_best_trial_of_each_family_is_rescored_on_the_whole_validation_split(ray_cluster, storage_url,
                                                                                 tmp_path) -> None:
    spec_data = {**TINY_SPEC, "name": "subset", "training": {**TINY_SPEC["training"], "validation_tokens": 400}}
    document = yaml.safe_dump(spec_data)
    spec, settings = parse_spec(document), Settings(storage_url, tmp_path / "artifacts")
    assert launch_study(spec, document, settings) == "complete"
    connect_ray(settings)
    run_full_validations(spec, settings)  # idempotent: nothing left to do where the study already did it
    valid = load_corpus(spec.dataset).valid
    for family in spec.families:
        (best,) = top_trials(storage_url, "subset", family, "tune", 1)
        checkpoint = load_checkpoint(settings.artifact_root / checkpoint_relative_path("subset", family, best.number))
        subset, whole = (searched_streams_cross_entropy(checkpoint.model, batchify(tokens, streams), 10).loss
                         for tokens, streams in ((valid[:400], 1), (valid, 4)))  # each at its chosen temperature
        assert best.value == pytest.approx(subset, rel=1e-9)
        assert best.full_value == pytest.approx(whole, rel=1e-9)
        assert best.full_value != pytest.approx(best.value, rel=1e-6)
        shown = TrialOut.of(get_trial(storage_url, best.trial_id))
        assert (shown.value, shown.full_value, shown.val_tokens, shown.val_subset) == (
            best.value, best.full_value, 400 - 1, True)
        assert shown.train_seconds > 0 and shown.eval_seconds > 0
        with sessions(storage_url)() as session:
            turns = session.scalars(select(TurnRecord).where(TurnRecord.trial_id == best.trial_id)).all()
        assert len(turns) == 3 and all(t.train_seconds > 0 and t.eval_seconds > 0 and t.val_subset for t in turns)
