"""Fine-tuning (AWD-LSTM's finetune.py): when it stops, what it averages, what a run with it reports and keeps, how it
resumes and recovers, and how the spec accepts it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sqlalchemy import select

from lm_tuner.api.schemas import TurnOut
from lm_tuner.models import ModelConfig
from lm_tuner.trainers import MarkovCorpusConfig, NTASGDConfig, Schedule, TrainingConfig, load_corpus, train
from lm_tuner.trainers import training_run as training_module
from lm_tuner.trainers.fine_tuning import FineTuningAveraging, FineTuningConfig
from lm_tuner.tuner.run.recorder import StudyRecorder
from lm_tuner.tuner.spec import load_spec
from lm_tuner.tuner.spec.estimate import CorpusSize, ProbeTiming, estimate_trial
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.schema import TrialRecord, TurnRecord
from tests.test_evaluation_subset import turn_result
from tests.test_spec import issues_of
from tests.test_trainers_training import comparable, inject_nan_at

CPU = torch.device("cpu")
SPACES = Path(__file__).parent.parent / "spaces"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(MarkovCorpusConfig(vocab_size=24, train_tokens=6000, valid_tokens=600, test_tokens=600))


def tiny_model(corpus) -> ModelConfig:
    return ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=16, num_layers=1)


OFF = FineTuningConfig()


def config(fine_tuning: FineTuningConfig = OFF, turns: int = 4) -> TrainingConfig:
    schedule = Schedule(turns=turns, steps_per_turn=5, batch_size=8, bptt=10, eval_batch_size=4, optimizer="sgd",
                        averaging=NTASGDConfig(interval=2), fine_tuning=fine_tuning)
    return TrainingConfig(schedule=schedule, learning_rate=0.5, seed=1)


def reference_stop(losses: list[float], nonmono: int) -> int:
    """The epoch (1-based) at which finetune.py exits, transcribed from it; len(losses) if it never does."""
    best_val_loss: list[float] = []
    for epoch, val_loss2 in enumerate(losses, start=1):
        if len(best_val_loss) > nonmono and val_loss2 > min(best_val_loss[:-nonmono]):
            return epoch
        best_val_loss.append(val_loss2)
    return len(losses)


SCRIPTS = [
    [2.9, 2.8, 2.85, 2.86, 2.95, 2.7, 2.6],  # worse than 2.8 at the 5th, with n = 2
    [3.0, 2.9, 2.8, 2.7, 2.6, 2.5, 2.4],  # always improving: never stops
    [3.0, 3.1, 3.2, 3.3, 3.4, 3.5, 3.6],  # worse than the first as soon as n + 1 turns came before
]


@pytest.mark.parametrize("losses", SCRIPTS)
def test_the_trigger_stops_at_the_turn_finetune_py_stops_at(losses: list[float]) -> None:
    averaging = FineTuningAveraging([torch.zeros(1)], interval=2)
    scored = iter(losses)
    stopped_at = len(losses)
    for turn in range(1, len(losses) + 1):
        averaging.evaluate([torch.zeros(1)], lambda weights: next(scored), 0.0)
        if averaging.stopped:
            stopped_at = turn
            break
    assert stopped_at == reference_stop(losses, nonmono=2)
    assert [reference_stop(script, 2) for script in SCRIPTS] == [5, 7, 4]


def test_a_run_stops_fine_tuning_on_the_trigger_and_keeps_the_best_turn(corpus, monkeypatch) -> None:
    main = [3.5, 3.2, 3.0]
    fine = [2.9, 2.8, 2.85, 2.86, 2.95, 2.0]  # the trigger fires on 2.95: 2.0 is never reached
    scripted = iter(main + fine)
    monkeypatch.setattr(training_module.TrainingRun, "_validation_loss", lambda run, weights: (next(scripted), 1.0))
    result = train(tiny_model(corpus), config(FineTuningConfig(enabled=True, interval=2, turns=10), turns=3), corpus,
                   device=CPU)
    assert [(t.turn, t.fine_tuning, t.val_loss, t.final) for t in result.turns] == [
        (1, False, 3.5, False), (2, False, 3.2, False), (3, False, 3.0, False),
        (4, True, 2.9, False), (5, True, 2.8, False), (6, True, 2.85, False), (7, True, 2.86, False),
        (8, True, 2.95, True),
    ]
    assert (result.best_val_loss, result.best_turn) == (2.8, 5)


def test_fine_tuning_starts_from_the_best_weights_and_averages_from_its_first_step(corpus) -> None:
    run = training_module.TrainingRun(tiny_model(corpus), config(FineTuningConfig(enabled=True), turns=2), corpus,
                                      CPU)
    for _ in range(2):
        run.train_turn()
        evaluated = run.evaluate()
        if evaluated.loss < run.best_val_loss:
            run.record_best(evaluated)
    best = [tensor.clone() for tensor in run.best_weights]
    run.start_fine_tuning_when_due()
    assert run.fine_tuning and all(torch.equal(p, b) for p, b in zip(run.params, best, strict=True))
    iterates: list[list[torch.Tensor]] = []
    add = run.averaging.add

    def keep(weights) -> None:
        iterates.append([w.detach().clone() for w in weights])
        add(weights)

    run.averaging.add = keep
    run.train_turn()
    evaluated = run.evaluate()
    assert len(iterates) == evaluated.length == 5
    for averaged, *steps in zip(evaluated.weights, *iterates, strict=True):
        torch.testing.assert_close(averaged, torch.stack(steps).mean(dim=0))


def test_a_tiny_run_with_fine_tuning_keeps_the_main_turns_and_ends_no_worse(corpus) -> None:
    without = train(tiny_model(corpus), config(), corpus, device=CPU)
    with_it = train(tiny_model(corpus), config(FineTuningConfig(enabled=True, turns=6)), corpus, device=CPU)
    main, fine = with_it.turns[:4], with_it.turns[4:]
    assert [comparable(t) | {"final": None} for t in main] == [comparable(t) | {"final": None}
                                                                 for t in without.turns]
    assert 1 <= len(fine) <= 6 and all(t.fine_tuning for t in fine) and fine[-1].final
    assert [t.averaging_length for t in fine] == [5 * k for k in range(1, len(fine) + 1)]
    assert with_it.best_val_loss <= without.best_val_loss
    # on this undertrained model, averaged further training helps: the best turn is a fine-tuning one
    assert with_it.best_turn > 4 and with_it.best_val_loss < without.best_val_loss


def test_default_fine_tuning_budget_is_as_many_turns_as_the_main_training(corpus, monkeypatch) -> None:
    improving = iter([5.0 - 0.1 * k for k in range(20)])
    monkeypatch.setattr(training_module.TrainingRun, "_validation_loss", lambda run, weights: (next(improving), 1.0))
    result = train(tiny_model(corpus), config(FineTuningConfig(enabled=True), turns=3), corpus, device=CPU)
    assert [t.fine_tuning for t in result.turns] == [False] * 3 + [True] * 3


@pytest.mark.parametrize("crash_after", [4, 5])  # the main training's last turn; the first fine-tuning turn
def test_a_run_interrupted_around_fine_tuning_resumes_to_the_same_numbers(corpus, tmp_path, crash_after) -> None:
    training = config(FineTuningConfig(enabled=True, turns=3))
    whole = train(tiny_model(corpus), training, corpus, device=CPU)

    def crash(report) -> None:
        if report.turn == crash_after:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tiny_model(corpus), training, corpus, latest_checkpoint_path=tmp_path / "latest.pt", on_turn=crash,
              device=CPU)
    resumed = train(tiny_model(corpus), training, corpus, resume_from=tmp_path / "latest.pt", device=CPU)
    assert [comparable(t) for t in resumed.turns] == [comparable(t) for t in whole.turns]


def test_a_divergence_in_the_first_fine_tuning_turn_starts_fine_tuning_again(corpus, monkeypatch) -> None:
    training = config(FineTuningConfig(enabled=True, turns=2), turns=2)
    inject_nan_at(monkeypatch, {2 * 5 + 3})  # the third step of fine-tuning
    result = train(tiny_model(corpus), training, corpus, device=CPU)
    assert [(t.turn, t.step, t.fine_tuning, t.divergences) for t in result.turns] == [
        (1, 5, False, 0), (2, 10, False, 0), (3, 15, True, 1), (4, 20, True, 1)]
    assert [t.learning_rate for t in result.turns] == pytest.approx([0.5, 0.5, 0.45, 0.45])
    assert result.turns[2].averaging_length == 5


def test_the_shipped_awd_lstm_spaces_fine_tune() -> None:
    full = load_spec(SPACES / "awd_lstm_ptb.yaml").training.fine_tuning
    small = load_spec(SPACES / "small" / "awd_lstm_ptb.yaml").training.fine_tuning
    assert (full.enabled, full.interval, full.turns) == (True, 5, 500)
    assert small.enabled and small.turns is not None


def test_off_by_default_and_left_out_of_the_dumped_schedule() -> None:
    assert not Schedule().fine_tuning.enabled
    assert "fine_tuning" not in Schedule().model_dump()  # studies and runs saved before it dump as they were
    on = Schedule(fine_tuning=FineTuningConfig(enabled=True, turns=3))
    assert on.model_dump()["fine_tuning"] == {"enabled": True, "interval": 5, "turns": 3}
    assert Schedule.model_validate(on.model_dump()) == on


@pytest.mark.parametrize(("fine_tuning", "field", "message"), [
    ({"enabled": False, "turns": 3}, "training.fine_tuning", "turns given, but fine-tuning is off"),
    ({"enabled": True, "interval": 0}, "training.fine_tuning.interval", "greater than or equal to 1"),
    ({"enabled": True, "turns": 0}, "training.fine_tuning.turns", "greater than or equal to 1"),
    ({"enabled": True, "epochs": 3}, "training.fine_tuning.epochs", "unknown field"),
    ({"enabled": "maybe"}, "training.fine_tuning.enabled", "bool"),
])
def test_the_spec_names_the_fine_tuning_field_at_fault(tiny_spec, fine_tuning, field, message) -> None:
    training = {"turns": 3, "steps_per_turn": 4, "batch_size": 8, "bptt": 10, "eval_batch_size": 4,
                "fine_tuning": fine_tuning}
    issues, text = issues_of(tiny_spec(training=training))
    assert field in issues, text
    assert message in issues[field].message


def test_the_plan_counts_every_fine_tuning_turn_the_budget_allows():
    timing = ProbeTiming(step_seconds=0.5, evaluation_seconds_per_token=0.001, cpu_per_wall=1.0)
    size = CorpusSize(vocab_size=20, train_tokens=16_001, valid_tokens=1_000, test_tokens=1_000)
    main = estimate_trial(Schedule(turns=3, steps_per_turn=10, eval_batch_size=10), timing, size)
    as_long = estimate_trial(Schedule(turns=3, steps_per_turn=10, eval_batch_size=10,
                                      fine_tuning=FineTuningConfig(enabled=True)), timing, size)
    capped = estimate_trial(Schedule(turns=3, steps_per_turn=10, eval_batch_size=10,
                                     fine_tuning=FineTuningConfig(enabled=True, turns=1)), timing, size)
    assert (as_long.turns, capped.turns) == (6, 4)
    assert as_long.trial_seconds == pytest.approx(2 * main.trial_seconds)
    assert capped.trial_seconds == pytest.approx(main.trial_seconds * 4 / 3)


def test_the_study_keeps_which_turns_were_fine_tuning(storage_url) -> None:
    ensure_schema(storage_url)
    with sessions(storage_url).begin() as session:
        session.add(TrialRecord(trial_id=1, study_name="tuned", family="awd_lstm", number=0, seed=0))
    recorder = StudyRecorder(storage_url)
    for turn, fine_tuning in ((1, False), (2, True)):
        recorder.on_trial_result(1, [], SimpleNamespace(config={"optuna_trial_id": 1}),
                                 turn_result(turn, train_seconds=1.0, eval_seconds=0.1) | {"fine_tuning": fine_tuning})
    with sessions(storage_url)() as session:
        turns = session.scalars(select(TurnRecord).where(TurnRecord.trial_id == 1).order_by(TurnRecord.turn)).all()
        assert [(turn.turn, turn.fine_tuning) for turn in turns] == [(1, False), (2, True)]
        assert [TurnOut.of(turn).fine_tuning for turn in turns] == [False, True]
