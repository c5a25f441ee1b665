"""How trials are proposed and stopped: early stopping is PRUNED (never COMPLETE); the GP proposes in batch."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import func, select

from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import TrialRecord, TurnRecord

pytestmark = pytest.mark.slow

LEARNING_RATE = {"learning_rate": {"low": 1e-6, "high": 0.05, "log": True}}


def run(document: str, url: str, tmp_path) -> list[optuna.trial.FrozenTrial]:
    assert launch_study(parse_spec(document), document, Settings(url, tmp_path / "artifacts")) == "complete"
    return optuna.load_study(study_name="tiny/lstm", storage=url).get_trials()


@pytest.mark.parametrize("method", ["asha", "median"])
def test_stopped_trials_are_pruned_with_their_last_value(method, ray_cluster, sqlite_url, tiny_spec, tmp_path):
    # A good first configuration, then three that cannot learn: the rule must stop those early.
    points = [{"learning_rate": 0.03}, *[{"learning_rate": 1e-6}] * 3]
    document = tiny_spec(
        families=["lstm"], fixed={"num_layers": 1}, search_space=LEARNING_RATE,
        training={"turns": 4, "steps_per_turn": 6, "batch_size": 8, "bptt": 10, "eval_batch_size": 4},
        tuning={"sampler": "random", "trials": 4, "concurrency": 1, "initial_points": points},
        early_stopping={"method": method, "grace_turns": 1, "reduction_factor": 2, "min_samples": 1},
    )
    trials = run(document, sqlite_url, tmp_path)
    assert [t.params["learning_rate"] for t in trials] == [p["learning_rate"] for p in points]
    assert trials[0].state == TrialState.COMPLETE
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert len(pruned) >= 2
    with sessions(sqlite_url)() as session:
        for trial in pruned:
            turns = session.scalar(select(func.count()).where(TurnRecord.trial_id == trial._trial_id))
            assert 1 <= turns < 4
            assert trial.user_attrs["last_value"] == trial.intermediate_values[turns]
            assert session.get(TrialRecord, trial._trial_id).state == "PRUNED"


def test_gp_proposes_while_trials_are_running(ray_cluster, sqlite_url, tiny_spec, tmp_path):
    document = tiny_spec(families=["lstm"], fixed={"num_layers": 1}, search_space=LEARNING_RATE,
                         tuning={"sampler": "gp", "trials": 6, "startup_trials": 2, "concurrency": 2})
    trials = run(document, sqlite_url, tmp_path)
    assert all(t.state == TrialState.COMPLETE for t in trials)
    proposed_by_gp = [t for t in trials if "gp:relative_params:0" in t.system_attrs]
    assert len(proposed_by_gp) >= 3  # after the 2 random start-up trials, the GP itself proposes

    def running_at(moment, other):
        return other.datetime_start < moment < other.datetime_complete

    # Batch acquisition: some GP proposals were made while another trial was still running.
    assert any(running_at(t.datetime_start, other) for t in proposed_by_gp for other in trials if other is not t)


@pytest.mark.parametrize("sampler", ["tpe", "qmc", "random"])
def test_every_sampler_runs_a_study(sampler, ray_cluster, sqlite_url, tiny_spec, tmp_path):
    document = tiny_spec(families=["lstm"], fixed={"num_layers": 1}, search_space=LEARNING_RATE,
                         tuning={"sampler": sampler, "trials": 2, "startup_trials": 1, "concurrency": 2})
    trials = run(document, sqlite_url, tmp_path)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
