"""Studies run for real: Ray Tune trials proposed by Optuna's GPSampler, on SQLite and PostgreSQL.

Each test asserts what the database holds afterwards, since the database is the source of truth.
"""

from __future__ import annotations

import socket

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import select

from lm_tuner.models import count_parameters
from lm_tuner.trainers import cross_entropy, load_checkpoint, load_corpus, sha256_of, unigram_perplexity
from lm_tuner.tuner.run.controller import (
    INTERRUPTED_REASON,
    StudyConflict,
    StudyRefused,
    launch_study,
    ray_address,
    run_claimed_study,
)
from lm_tuner.tuner.run.queue import claim_next_study, submit_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.schema import CheckpointRecord, StudyRecord, TrialRecord, TurnRecord

pytestmark = pytest.mark.slow


def run(document: str, url: str, tmp_path) -> tuple[str, Settings]:
    settings = Settings(url, tmp_path / "artifacts")
    return launch_study(parse_spec(document), document, settings), settings


def test_two_trial_study_lands_in_the_database(ray_cluster, storage_url, tiny_spec, tmp_path):
    document = tiny_spec()
    spec = parse_spec(document)
    status, settings = run(document, storage_url, tmp_path)
    assert status == "complete"

    corpus = load_corpus(spec.dataset)
    storage = optuna.storages.RDBStorage(storage_url)
    with sessions(storage_url)() as session:
        study = session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny"))
        assert (study.status, study.error, study.controller) == ("complete", None, None)
        assert study.spec == spec.model_dump(mode="json") and study.document == document
        assert study.best_possible_loss == pytest.approx(corpus.best_cross_entropy)
        assert study.unigram_perplexity == pytest.approx(unigram_perplexity(corpus))  # reports read it from here
        for family in ("lstm", "mogrifier"):
            (trial,) = optuna.load_study(study_name=f"tiny/{family}", storage=storage).get_trials()
            assert trial.state == TrialState.COMPLETE
            turns = session.scalars(select(TurnRecord).where(TurnRecord.trial_id == trial._trial_id)
                                    .order_by(TurnRecord.turn)).all()
            assert [t.turn for t in turns] == [1, 2, 3]
            assert [t.step for t in turns] == [4, 8, 12]
            # the compute account: tokens (steps x batch 8 x window 10) and CPU seconds, growing, on every turn
            assert [t.tokens for t in turns] == [320, 640, 960]
            assert 0 < turns[0].compute_seconds <= turns[1].compute_seconds <= turns[2].compute_seconds
            assert all(t.reported_at is not None for t in turns)
            assert trial.value == min(t.val_loss for t in turns)
            assert trial.intermediate_values == {t.turn: t.best_val_loss for t in turns}

            record = session.get(TrialRecord, trial._trial_id)
            assert (record.family, record.number, record.fail_reason) == (family, 0, None)
            assert (record.state, record.value) == ("COMPLETE", trial.value)  # the ledger agrees with Optuna
            assert (record.tokens, record.compute_seconds) == (960, turns[-1].compute_seconds)
            assert record.parameter_count <= spec.parameter_budget
            assert trial.user_attrs["parameter_count"] == record.parameter_count
            assert set(trial.params) == set(spec.searched_for(family))

            saved = session.get(CheckpointRecord, trial._trial_id)
            path = settings.artifact_root / saved.path
            assert saved.sha256 == sha256_of(path) and saved.size_bytes == path.stat().st_size
            assert saved.val_loss == trial.value

            # The best checkpoint reloads and reproduces the validation loss the study stored.
            checkpoint = load_checkpoint(path)
            assert checkpoint.vocabulary == corpus.vocabulary
            assert count_parameters(checkpoint.model.config) == record.parameter_count
            schedule = checkpoint.metadata["training"]["schedule"]
            reproduced = cross_entropy(checkpoint.model, corpus.valid, schedule["eval_batch_size"], schedule["bptt"],
                                       logit_scale=checkpoint.metadata["val_logit_scale"])  # the turn's temperature
            assert reproduced == pytest.approx(trial.value, rel=1e-6)


def test_relaunch_continues_an_identical_spec_and_refuses_a_different_one(ray_cluster, sqlite_url, tiny_spec,
                                                                         tmp_path):
    search = {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}}
    document = tiny_spec(families=["lstm"], fixed={"num_layers": 1}, search_space=search)
    assert run(document, sqlite_url, tmp_path)[0] == "complete"
    assert run(document, sqlite_url, tmp_path)[0] == "complete"  # nothing left to run
    trials = optuna.load_study(study_name="tiny/lstm", storage=sqlite_url).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE]

    changed = tiny_spec(families=["lstm"], fixed={"num_layers": 1}, search_space=search,
                        parameter_budget=9000)
    with pytest.raises(StudyConflict, match="already exists with a different spec"):
        run(changed, sqlite_url, tmp_path)


def test_trials_left_running_by_a_dead_controller_are_failed_and_replaced(ray_cluster, sqlite_url, tiny_spec,
                                                                          tmp_path):
    search = {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}}
    document = tiny_spec(families=["lstm"], fixed={"num_layers": 1}, search_space=search)
    spec = parse_spec(document)
    # The state a SIGKILLed controller leaves: study "running" under a dead process, one trial RUNNING.
    ensure_schema(sqlite_url)
    storage = optuna.storages.RDBStorage(sqlite_url)
    zombie = optuna.create_study(study_name="tiny/lstm", storage=storage).ask()
    with sessions(sqlite_url).begin() as session:
        session.add(StudyRecord(name="tiny", status="running", spec=spec.model_dump(mode="json"), document=document,
                                families=",lstm,", submitted_via="cli",
                                controller=f"{socket.gethostname()}:999999999"))
        session.add(TrialRecord(trial_id=zombie._trial_id, study_name="tiny", family="lstm", number=0,
                                hidden_size=1, parameter_count=1, seed=0))

    assert run(document, sqlite_url, tmp_path)[0] == "complete"

    states = [t.state for t in optuna.load_study(study_name="tiny/lstm", storage=storage).get_trials()]
    assert states == [TrialState.FAIL, TrialState.COMPLETE]  # no zombie; the budget of 1 trial still ran
    with sessions(sqlite_url)() as session:
        record = session.get(TrialRecord, zombie._trial_id)
        assert (record.fail_reason, record.interrupted, record.state) == (INTERRUPTED_REASON, True, "FAIL")


def test_trial_that_cannot_fit_the_budget_fails_with_its_reason(ray_cluster, sqlite_url, tiny_spec, tmp_path):
    search = {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}, "num_layers": {"choices": [16]}}
    # 100 parameters fit the default 2 layers (so the study starts) but not 16.
    document = tiny_spec(families=["lstm"], fixed={}, search_space=search, parameter_budget=100)
    assert run(document, sqlite_url, tmp_path)[0] == "failed"  # no trial completed: nothing to compare
    (trial,) = optuna.load_study(study_name="tiny/lstm", storage=sqlite_url).get_trials()
    assert trial.state == TrialState.FAIL and trial.value is None
    with sessions(sqlite_url)() as session:
        record = session.get(TrialRecord, trial._trial_id)
    assert "parameter_budget: 100 is too small" in record.fail_reason and record.state == "FAIL"


def test_budget_too_small_for_any_model_is_refused_before_the_study_exists(sqlite_url, tiny_spec, tmp_path):
    document = tiny_spec(parameter_budget=50)
    ensure_schema(sqlite_url)
    with pytest.raises(StudyRefused, match="parameter_budget: family 'lstm': 50 is too small"):
        run(document, sqlite_url, tmp_path)
    with sessions(sqlite_url)() as session:
        assert session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny")) is None  # nothing half-made
    # A queued study (its corpus unknown at submission) fails when its worker finds out, before any trial.
    submit_study(sqlite_url, parse_spec(document), document)
    claim_next_study(sqlite_url)
    with pytest.raises(StudyRefused):
        run_claimed_study(parse_spec(document), Settings(sqlite_url, tmp_path / "artifacts"))
    with sessions(sqlite_url)() as session:
        study = session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny"))
    assert study.status == "failed" and "too small" in study.error


def test_without_an_address_trials_run_on_a_private_local_ray(monkeypatch, tmp_path):
    # Ray's own default would attach to whichever cluster this machine started last.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(Settings("sqlite://", tmp_path)) == "local"
    monkeypatch.setenv("RAY_ADDRESS", "ray-head:6379")  # how docker-compose points workers at the head
    assert ray_address(Settings("sqlite://", tmp_path)) == "ray-head:6379"
    assert ray_address(Settings("sqlite://", tmp_path, ray_address="10.0.0.7:6379")) == "10.0.0.7:6379"
