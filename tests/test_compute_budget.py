"""A study with a compute budget (issue 40): the budget split among the families in equal tokens (or compute),
successive halving on rungs of training tokens, promotions on results at the same rung, a sampler that learns from
the rungs, and a study that continues its brackets after its controller stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from sqlalchemy import select

from lm_tuner.tuner.analysis.comparison import comparison
from lm_tuner.tuner.run import budgeting
from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.run.halving import RUNG
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord, TurnRecord
from tests.conftest import TINY_SPEC

pytestmark = pytest.mark.slow


def budgeted(**fields) -> str:
    training = {key: value for key, value in TINY_SPEC["training"].items() if key != "turns"}
    return yaml.safe_dump({**TINY_SPEC, "name": "budgeted", "training": training,
                           "tuning": {"sampler": "tpe", "concurrency": 2},
                           "compute_budget": {"core_hours": 0.001, "rungs": 2}, **fields}, sort_keys=False)


@pytest.fixture
def quick_probe(monkeypatch):
    monkeypatch.setattr(budgeting, "PLAN_PROBE_SECONDS", 1.0)


def test_a_budgeted_study_halves_on_rungs_of_equal_tokens(ray_cluster, storage_url, tmp_path, quick_probe):
    document = budgeted()
    spec = parse_spec(document)
    assert spec.tuning.trials == 3  # the rungs' configurations: 1 finalist x 3^(2 - 1)
    assert launch_study(spec, document, Settings(storage_url, tmp_path / "artifacts")) == "complete"

    with sessions(storage_url)() as session:
        plan = session.scalar(select(StudyRecord.plan).where(StudyRecord.name == "budgeted"))
        records = session.scalars(select(TrialRecord).where(TrialRecord.study_name == "budgeted")).all()
        turns = {record.trial_id: session.scalars(select(TurnRecord).where(TurnRecord.trial_id == record.trial_id)
                                                  .order_by(TurnRecord.turn)).all() for record in records}
    rungs = [[rung["steps"] for rung in family["rungs"]] for family in plan["families"]]
    assert rungs[0] == rungs[1] and rungs[0][0] < rungs[0][1]  # the same rungs for both families, in steps
    low, top = rungs[0]
    tokens = {}
    for family in spec.families:
        trials = optuna.load_study(study_name=f"budgeted/{family}", storage=storage_url).get_trials()
        assert sorted(t.state.name for t in trials) == ["COMPLETE", "PRUNED", "PRUNED"]
        at_low = {t.number: t.intermediate_values[low // 4] for t in trials}  # every one was scored at rung 0
        (finalist,) = [t for t in trials if t.state == TrialState.COMPLETE]
        assert at_low[finalist.number] == min(at_low.values())  # promoted on its result at the same rung
        assert finalist.user_attrs[RUNG] == 1
        family_records = [r for r in records if r.family == family]
        for record in family_records:
            steps = [turn.step for turn in turns[record.trial_id]]
            trained = top if record.trial_id == finalist._trial_id else low
            assert steps == list(range(4, trained + 1, 4))  # one run, paused at rung 0 where promoted
            assert record.tokens == turns[record.trial_id][-1].tokens
        tokens[family] = sum(record.tokens for record in family_records)
    # the same windows for both: equal tokens, the plan's up to the short windows that end each pass
    assert tokens["lstm"] == tokens["mogrifier"] == pytest.approx((3 * low + (top - low)) * 80, rel=0.01)
    assert plan["families"][0]["tokens"] == (3 * low + (top - low)) * 80
    # the comparison counts the configurations left at rung 0 as stopped early, not as nothing
    results = comparison(storage_url, "budgeted").families
    assert [(r.complete_tuning_trials, r.stopped_tuning_trials) for r in results] == [(1, 2), (1, 2)]


def test_a_stopped_study_continues_its_brackets_where_they_stood(sqlite_url, tmp_path):
    """Ctrl-C once a configuration has its result at the lowest rung, then `tuner resume`: no configuration is trained
    again from its start, none is lost or replaced, the rungs are those the first run planned, and the reruns train
    as far as the finalists."""
    space = tmp_path / "budgeted.yaml"
    space.write_text(budgeted(reruns={"top": 1, "seeds": 2}))
    environment = {**os.environ, "LM_TUNER_HOME": str(tmp_path / "home"), "LM_TUNER_STORAGE": sqlite_url,
                   "COLUMNS": "200"}
    launch = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "launch", "--space", str(space)],
                              env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in launch.stdout:
        lines.append(line)
        if line.startswith("rung 0"):
            launch.send_signal(signal.SIGINT)
            break
    output = "".join(lines) + launch.communicate(timeout=300)[0]
    assert launch.returncode == 130, output
    with sessions(sqlite_url)() as session:
        plan = session.scalar(select(StudyRecord.plan).where(StudyRecord.name == "budgeted"))
    left = [t for family in ("lstm", "mogrifier") for t in optuna.load_study(
        study_name=f"budgeted/{family}", storage=sqlite_url).get_trials() if t.state == TrialState.RUNNING]
    assert left  # left running, to be continued: not failed and replaced

    resumed = subprocess.run([sys.executable, "-m", "lm_tuner.tuner", "resume", "budgeted"], env=environment,
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    with sessions(sqlite_url)() as session:
        assert session.scalar(select(StudyRecord.plan).where(StudyRecord.name == "budgeted")) == plan  # kept
        records = session.scalars(select(TrialRecord).where(TrialRecord.study_name == "budgeted")).all()
        steps = {r.trial_id: [t.step for t in session.scalars(select(TurnRecord).where(
            TurnRecord.trial_id == r.trial_id).order_by(TurnRecord.turn))] for r in records}
    low, top = (rung["steps"] for rung in plan["families"][0]["rungs"])
    tuning = [r for r in records if r.stage == "tune"]
    assert sorted(r.state for r in tuning) == ["COMPLETE"] * 2 + ["PRUNED"] * 4  # three configurations per family
    for record in tuning:  # each trained once, from its start to where its rung ended
        assert steps[record.trial_id] == list(range(4, (top if record.state == "COMPLETE" else low) + 1, 4))
    reruns = [r for r in records if r.stage == "rerun"]
    assert len(reruns) == 4 and all(steps[r.trial_id][-1] == top for r in reruns)
