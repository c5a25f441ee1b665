"""The training loop: budgets, the objective, divergence recovery, checkpoints and exact resumption."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from lm_tuner.models import LanguageModel, ModelConfig
from lm_tuner.trainers import (
    MarkovCorpusConfig,
    Schedule,
    TrainingConfig,
    TrainingDiverged,
    TwoTailedAveragingConfig,
    artifact_store,
    cross_entropy,
    load_checkpoint,
    load_corpus,
    train,
)
from lm_tuner.trainers import training_run as training_module
from lm_tuner.trainers.objective import average_over_samples, multi_sample_nll
from lm_tuner.trainers.optimizers import make_optimizer

CPU = torch.device("cpu")
CORPUS_CONFIG = MarkovCorpusConfig(vocab_size=24, train_tokens=6000, valid_tokens=600, test_tokens=600)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(CORPUS_CONFIG)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # numbers independent of the thread count


def tiny_model(corpus, **dropout) -> ModelConfig:
    return ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=16, num_layers=1, **dropout)


def schedule(**fields) -> Schedule:
    return Schedule(**{"turns": 3, "steps_per_turn": 4, "batch_size": 8, "bptt": 10, "eval_batch_size": 4} | fields)


def test_budget_in_steps_ends_with_a_partial_turn(corpus) -> None:
    result = train(tiny_model(corpus), TrainingConfig(schedule=Schedule(budget_steps=10, steps_per_turn=4,
                                                                        batch_size=8, bptt=10)), corpus, device=CPU)
    assert [(t.turn, t.step, t.final) for t in result.turns] == [(1, 4, False), (2, 8, False), (3, 10, True)]


def test_each_turn_reports_the_training_tokens_so_far(corpus) -> None:
    result = train(tiny_model(corpus), TrainingConfig(schedule=Schedule(budget_steps=10, steps_per_turn=4,
                                                                        batch_size=8, bptt=10)), corpus, device=CPU)
    assert [t.tokens for t in result.turns] == [4 * 80, 8 * 80, 10 * 80]  # steps x batch x window


def test_budget_in_epochs_stops_at_the_end_of_the_pass(corpus) -> None:
    # 6000 tokens in 8 streams: 750 rows, 749 of which start a window: 75 windows of up to 10 steps.
    config = TrainingConfig(schedule=Schedule(budget_epochs=1.0, steps_per_turn=50, batch_size=8, bptt=10))
    result = train(tiny_model(corpus), config, corpus, device=CPU)
    assert [(t.step, t.epochs, t.final) for t in result.turns] == [(50, 500 / 749, False), (75, 1.0, True)]


@pytest.mark.parametrize("clock", ["wall", "process"])
def test_budget_in_seconds_counts_the_chosen_clock(corpus, clock: str) -> None:
    config = TrainingConfig(schedule=Schedule(budget_seconds=1.0, clock=clock, steps_per_turn=5, batch_size=8,
                                              bptt=10))
    result = train(tiny_model(corpus), config, corpus, device=CPU)
    last = result.turns[-1]
    assert last.final and (last.wall_seconds if clock == "wall" else last.process_seconds) >= 1.0
    assert not any(t.final for t in result.turns[:-1])


@pytest.mark.parametrize(("fields", "message"), [
    ({"turns": 5, "budget_seconds": 60}, "turns and budget_seconds are both budgets; give one"),
    ({"budget_steps": 5, "budget_epochs": 1}, "budget_steps and budget_epochs are all budgets; give one"),
    ({"averaging": {"kind": "3ta"}}, "'none', 'tail', 'nt-asgd', '2ta'"),
    ({"optimizer": "adagrad"}, "'adam', 'radam' or 'sgd'"),
])
def test_schedule_refuses_contradictions_and_unknown_choices(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Schedule.model_validate(fields)


def test_multi_sample_objective_averages_probabilities_over_dropout_masks(corpus) -> None:
    torch.manual_seed(0)
    model = LanguageModel(tiny_model(corpus, input_dropout=0.5, output_dropout=0.5)).train()
    inputs, targets = corpus.train[:40].view(10, 4), corpus.train[1:41].view(10, 4)
    nll, _ = multi_sample_nll(model, inputs, targets, model.initial_state(3 * 4), samples=3)
    assert nll.shape == (10, 4)
    per_sample = torch.rand(10, 3 * 4) * 5
    mixed = average_over_samples(per_sample, 3)
    probabilities = torch.exp(-per_sample).view(10, 3, 4).mean(dim=1)
    torch.testing.assert_close(mixed, -torch.log(probabilities))
    assert (mixed <= per_sample.view(10, 3, 4).mean(dim=1) + 1e-6).all()  # Jensen: a tighter bound

    deterministic = LanguageModel(tiny_model(corpus)).train()
    one, _ = multi_sample_nll(deterministic, inputs, targets, deterministic.initial_state(4), samples=1)
    three, _ = multi_sample_nll(deterministic, inputs, targets, deterministic.initial_state(12), samples=3)
    torch.testing.assert_close(one, three)  # without dropout every sample predicts the same


def test_best_checkpoint_holds_the_evaluated_weights_config_and_vocabulary(corpus, tmp_path: Path) -> None:
    config = TrainingConfig(schedule=schedule(turns=6, averaging=TwoTailedAveragingConfig()), learning_rate=0.01)
    result = train(tiny_model(corpus), config, corpus, checkpoint_path=tmp_path / "best.pt", device=CPU,
                   metadata={"trial": 7})
    checkpoint = load_checkpoint(tmp_path / "best.pt")
    best = result.turns[result.best_turn - 1]
    assert checkpoint.metadata | {"trial": 7} == checkpoint.metadata
    assert (checkpoint.metadata["val_loss"], checkpoint.metadata["turn"]) == (result.best_val_loss, best.turn)
    assert checkpoint.metadata["val_logit_scale"] == best.val_logit_scale
    assert checkpoint.metadata["averaging_length"] == best.averaging_length
    assert checkpoint.metadata["training"] == config.model_dump()
    assert checkpoint.vocabulary == corpus.vocabulary and checkpoint.model.config == tiny_model(corpus)
    at_its_temperature = cross_entropy(checkpoint.model, corpus.valid, 4, 10, logit_scale=best.val_logit_scale)
    assert at_its_temperature == result.best_val_loss
    assert any(t.averaging_length > 1 for t in result.turns)


def test_each_improved_turn_reports_its_checkpoints_hash_and_size_without_reading_it_back(corpus,
                                                                                          monkeypatch) -> None:
    location = "memory://lm-tuner-tests/reports/best.pt"  # object storage: a read back would be a download
    monkeypatch.setattr(artifact_store, "_open_object", lambda *_: pytest.fail("a written checkpoint was read back"))
    monkeypatch.setattr(artifact_store, "local_copy", lambda *_: pytest.fail("a written checkpoint was copied"))
    reports = []
    train(tiny_model(corpus), TrainingConfig(schedule=schedule(turns=4), learning_rate=0.01), corpus,
          checkpoint_path=location, device=CPU, on_turn=reports.append)
    monkeypatch.undo()
    improved = [report for report in reports if report.improved]
    assert improved and all(r.checkpoint_sha256 is None is r.checkpoint_bytes for r in reports if not r.improved)
    stored = b"".join(artifact_store.chunks(location))
    assert (improved[-1].checkpoint_sha256, improved[-1].checkpoint_bytes) == (hashlib.sha256(stored).hexdigest(),
                                                                               len(stored))
    artifact_store.remove_tree("memory://lm-tuner-tests/reports")


def inject_nan_at(monkeypatch, calls: set[int]) -> list[int]:
    """Make the training loss NaN on the given calls of the objective (1-based)."""
    seen = [0]
    objective = training_module.multi_sample_nll

    def poisoned(*args, **kwargs):
        nll, state = objective(*args, **kwargs)
        seen[0] += 1
        return (nll * math.nan if seen[0] in calls else nll), state

    monkeypatch.setattr(training_module, "multi_sample_nll", poisoned)
    return seen


def test_divergence_restarts_from_the_last_good_turn_with_a_lower_learning_rate(corpus, monkeypatch) -> None:
    config = TrainingConfig(schedule=schedule(turns=3), learning_rate=0.01)
    clean = train(tiny_model(corpus), config, corpus, device=CPU)
    calls = inject_nan_at(monkeypatch, {6})  # the second step of turn 2
    recovered = train(tiny_model(corpus), config, corpus, device=CPU)
    assert calls[0] == 3 * 4 + 2  # turn 2 was started again from its beginning
    assert [t.step for t in recovered.turns] == [4, 8, 12]
    assert [t.divergences for t in recovered.turns] == [0, 1, 1]
    assert [t.learning_rate for t in recovered.turns] == [0.01, 0.01 * 0.9, 0.01 * 0.9]
    assert comparable(recovered.turns[0]) == comparable(clean.turns[0])
    assert recovered.turns[1].val_loss != clean.turns[1].val_loss


def test_divergence_backoff_compounds_over_retries_from_the_same_state(corpus, monkeypatch) -> None:
    config = TrainingConfig(schedule=schedule(turns=3, divergence_retries=3), learning_rate=0.01)
    calls = inject_nan_at(monkeypatch, {6, 8, 10})  # turn 2 diverges at its second step, three times running
    recovered = train(tiny_model(corpus), config, corpus, device=CPU)
    assert calls[0] == 4 + 3 * 2 + 4 + 4
    assert [t.divergences for t in recovered.turns] == [0, 3, 3]
    assert [t.learning_rate for t in recovered.turns] == pytest.approx([0.01, 0.01 * 0.729, 0.01 * 0.729])


def test_divergence_backoff_survives_resume(corpus, monkeypatch, tmp_path: Path) -> None:
    config = TrainingConfig(schedule=schedule(turns=3), learning_rate=0.01)
    inject_nan_at(monkeypatch, {6})

    def crash_after_turn_2(report) -> None:
        if report.turn == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny_model(corpus), config, corpus, latest_checkpoint_path=tmp_path / "latest.pt",
              on_turn=crash_after_turn_2, device=CPU)
    inject_nan_at(monkeypatch, {1})  # the resumed run's first step diverges: its second divergence
    resumed = train(tiny_model(corpus), config, corpus, resume_from=tmp_path / "latest.pt", device=CPU)
    assert [(t.divergences, t.learning_rate) for t in resumed.turns][-1] == (2, pytest.approx(0.01 * 0.81))


def test_a_retry_draws_fresh_dropout_noise(corpus) -> None:
    config = TrainingConfig(schedule=schedule(), learning_rate=0.01, seed=5)
    run = training_module.TrainingRun(tiny_model(corpus, output_dropout=0.5), config, corpus, CPU)
    good = run.state_dict()
    masks = []
    for _ in range(2):
        run.recover(good)
        masks.append(torch.rand(8))
    torch.set_rng_state(good["rng"])
    replayed = torch.rand(8)
    assert not torch.equal(masks[0], replayed) and not torch.equal(masks[0], masks[1])
    again = training_module.TrainingRun(tiny_model(corpus, output_dropout=0.5), config, corpus, CPU)
    again.recover(again.state_dict())
    assert torch.equal(torch.rand(8), masks[0])  # fresh, yet reproducible from the seed


def test_divergence_fails_with_the_reason_after_the_retries(corpus, monkeypatch) -> None:
    inject_nan_at(monkeypatch, set(range(6, 100)))  # step 6, then step 5 of each restart from step 4
    config = TrainingConfig(schedule=schedule(divergence_retries=2), learning_rate=0.01)
    with pytest.raises(TrainingDiverged, match=r"at step 5 the training loss is nan.*gave up after 2 restart"):
        train(tiny_model(corpus), config, corpus, device=CPU)


RUN = """
import os, signal, sys
from pathlib import Path
import torch
sys.path.insert(0, {repo!r})
from tests.test_trainers_training import resume_setup
from lm_tuner.trainers import train
torch.set_num_threads(1)
model, config, corpus = resume_setup()

def kill_after_turn_3(report):
    if report.turn == 3:
        os.kill(os.getpid(), signal.SIGKILL)

train(model, config, corpus, checkpoint_path=Path({best!r}), latest_checkpoint_path=Path({latest!r}),
      on_turn=kill_after_turn_3, device=torch.device("cpu"))
"""


def resume_setup():
    """A run that exercises every part of the training state: dropout, variable windows, D = 2 samples,
    RAdam, L2 and Two-Tailed Averaging."""
    corpus = load_corpus(CORPUS_CONFIG)
    model = ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=16, num_layers=2, family="mogrifier",
                        mogrifier_rounds=2, input_dropout=0.2, state_dropout=0.2, output_dropout=0.2)
    config = TrainingConfig(
        schedule=schedule(turns=6, variable_bptt=True, dropout_samples=2, optimizer="radam",
                          averaging=TwoTailedAveragingConfig(patience=1)),
        learning_rate=0.01, l2_penalty=1e-4, seed=3,
    )
    return model, config, corpus


def comparable(report) -> dict:
    clocks = ("wall_seconds", "process_seconds", "tokens_per_second", "train_seconds", "eval_seconds",
              "checkpoint_seconds", "setup_seconds")
    files = ("checkpoint_sha256", "checkpoint_bytes")  # torch.save names the archive's folder after the file
    return asdict(report) | dict.fromkeys(clocks + files)


def test_a_killed_run_resumes_to_the_numbers_of_an_uninterrupted_run(tmp_path: Path) -> None:
    model, config, corpus = resume_setup()
    whole = train(model, config, corpus, checkpoint_path=tmp_path / "whole.pt", device=CPU)

    killed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN).format(repo=str(REPO), best=str(tmp_path / "best.pt"),
                                                           latest=str(tmp_path / "latest.pt"))],
        capture_output=True, text=True, timeout=300,
    )
    assert killed.returncode == -9, killed.stderr
    assert load_checkpoint(tmp_path / "latest.pt").metadata["turn"] == 3

    resumed = train(model, config, corpus, checkpoint_path=tmp_path / "best.pt",
                    latest_checkpoint_path=tmp_path / "latest.pt", resume_from=tmp_path / "latest.pt", device=CPU)
    assert [comparable(t) for t in resumed.turns] == [comparable(t) for t in whole.turns]
    assert (resumed.best_val_loss, resumed.best_turn) == (whole.best_val_loss, whole.best_turn)
    for name, tensor in load_checkpoint(tmp_path / "whole.pt").model.state_dict().items():
        assert torch.equal(tensor, load_checkpoint(tmp_path / "best.pt").model.state_dict()[name]), name


def test_a_run_paused_at_a_step_resumes_to_the_numbers_of_one_that_never_paused(corpus, tmp_path: Path) -> None:
    config = TrainingConfig(schedule=Schedule(budget_steps=12, steps_per_turn=4, batch_size=8, bptt=10,
                                              eval_batch_size=4), seed=3)
    whole = train(tiny_model(corpus, output_dropout=0.3), config, corpus, device=CPU)
    paused = train(tiny_model(corpus, output_dropout=0.3), config, corpus,
                   latest_checkpoint_path=tmp_path / "latest.pt", stop_at_step=8, device=CPU)
    assert [(t.step, t.final) for t in paused.turns] == [(4, False), (8, False)]  # a rung's end, not the budget's
    resumed = train(tiny_model(corpus, output_dropout=0.3), config, corpus, resume_from=tmp_path / "latest.pt",
                    device=CPU)
    assert [comparable(t) for t in resumed.turns] == [comparable(t) for t in whole.turns]  # its turns, all of them
    assert [comparable(t) for t in paused.turns] == [comparable(t) for t in whole.turns[:2]]
    told = []
    train(tiny_model(corpus, output_dropout=0.3), config, corpus, resume_from=tmp_path / "latest.pt",
          on_turn=told.append, report_restored=True, device=CPU)  # what a listener that stopped may have missed
    assert [t.turn for t in told] == [1, 2, 3]


def test_a_run_saved_before_fields_were_added_resumes(corpus, tmp_path: Path) -> None:
    config = TrainingConfig(schedule=schedule(turns=2))
    train(tiny_model(corpus), config, corpus, latest_checkpoint_path=tmp_path / "latest.pt",
          on_turn=lambda report: None, device=CPU)
    payload = torch.load(tmp_path / "latest.pt", weights_only=True)
    state = payload["training_state"]
    del state["model_config"]["ar_alpha"]  # a family's own field, added later
    torch.save(payload, tmp_path / "older.pt")
    resumed = train(tiny_model(corpus), config, corpus, resume_from=tmp_path / "older.pt", device=CPU)
    assert [turn.turn for turn in resumed.turns] == [1, 2]
    del state["training"]["schedule"]["search_temperature"]  # a newer training setting may change the objective
    torch.save(payload, tmp_path / "older.pt")
    with pytest.raises(ValueError, match=r"schedule.search_temperature: None there, True here"):
        train(tiny_model(corpus), config, corpus, resume_from=tmp_path / "older.pt", device=CPU)


def test_resume_refuses_another_configuration(corpus, tmp_path: Path) -> None:
    config = TrainingConfig(schedule=schedule(turns=1))
    train(tiny_model(corpus), config, corpus, latest_checkpoint_path=tmp_path / "latest.pt", device=CPU)
    other = config.model_copy(update={"learning_rate": 0.5})
    with pytest.raises(ValueError, match=r"another configuration \(training.learning_rate: 0.003 there, 0.5 here\)"):
        train(tiny_model(corpus), other, corpus, resume_from=tmp_path / "latest.pt", device=CPU)
    train(tiny_model(corpus), config, corpus, checkpoint_path=tmp_path / "best.pt", device=CPU)
    with pytest.raises(ValueError, match="holds weights only"):
        train(tiny_model(corpus), config, corpus, resume_from=tmp_path / "best.pt", device=CPU)


def test_sgd_is_plain_sgd(corpus) -> None:
    params = [torch.nn.Parameter(torch.ones(3))]
    optimizer = make_optimizer("sgd", params, 0.5)
    params[0].grad = torch.full((3,), 2.0)
    optimizer.step()
    torch.testing.assert_close(params[0].detach(), torch.zeros(3))  # 1 - 0.5 * 2, no momentum, no scaling
    config = TrainingConfig(schedule=schedule(optimizer="sgd"), learning_rate=0.5)
    result = train(tiny_model(corpus), config, corpus, device=CPU)
    assert result.turns[-1].val_loss < result.turns[0].val_loss
