"""Progress that adds up: per stage, against the plan as the controller counts it, never past 100%, with
an ETA that accounts for trials running at once. Trial rows are written directly (no Ray, no training)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from types import SimpleNamespace

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import select

from lm_tuner.api.pages import _study
from lm_tuner.dashboards import render
from lm_tuner.tuner.cli.progress import ProgressPrinter
from lm_tuner.tuner.run.queue import submit_study
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.documents import StudyOut
from lm_tuner.tuner.store.engine import ensure_schema, optuna_storage, sessions
from lm_tuner.tuner.store.optuna_names import optuna_study_name
from lm_tuner.tuner.store.progress import StageTally, budgeted_seconds_left, estimated_seconds_left, planned_stages
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord, utcnow
from lm_tuner.tuner.store.studies import get_study, list_studies
from tests.conftest import TINY_SPEC

ONE_FAMILY = {**TINY_SPEC, "families": ["lstm"], "fixed": {"num_layers": 1},
              "search_space": {"learning_rate": {"low": 0.001, "high": 0.01}}}
STAGED = {"reruns": {"top": 1, "seeds": 3}, "evaluation": {"bptt": 10},
          "dynamic_evaluation": {"top": 1, "trials": 2}}
OPTUNA_STUDY = {"tune": (), "rerun": ("reruns",), "dyneval": ("dyneval", "0")}


def add_study(url: str, name: str, status: str = "running", **fields: object) -> None:
    """A study first started a day ago (so it was resumed since), tuning one family two trials at a time."""
    ensure_schema(url)
    submit_study(url, parse_spec({**ONE_FAMILY, "name": name, **fields}), "document")
    with sessions(url).begin() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
        record.status, record.started_at = status, utcnow() - timedelta(days=1)


def add_trial(url: str, study: str, stage: str, state: str, *, seconds: float = 10.0, interrupted: bool = False,
              family: str = "lstm", params: dict[str, float | str] | None = None) -> int:
    """A trial as the controller leaves it: Optuna's row, started `seconds` ago (and ended now unless it is
    running), and the project's row beside it."""
    params = params or {}
    optuna_study = optuna.create_study(storage=optuna_storage(url), load_if_exists=True,
                                       study_name=optuna_study_name(study, family, *OPTUNA_STUDY[stage]))
    value = 1.0 if state == "COMPLETE" else None
    start = datetime.now() - timedelta(seconds=seconds)  # naive local time, as Optuna writes it
    optuna_study.add_trial(FrozenTrial(
        number=0, state=TrialState[state], value=value, datetime_start=start,
        datetime_complete=None if state == "RUNNING" else start + timedelta(seconds=seconds), params=params,
        distributions={name: CategoricalDistribution([value]) if isinstance(value, str) else FloatDistribution(0.0, 1.0)
                       for name, value in params.items()}, user_attrs={}, system_attrs={},
        intermediate_values={}, trial_id=0))
    trial = optuna_study.get_trials(deepcopy=False)[-1]
    with sessions(url).begin() as session:
        session.add(TrialRecord(trial_id=trial._trial_id, study_name=study, family=family, stage=stage,
                                number=trial.number, seed=0, state=state, value=value, interrupted=interrupted))
    return trial._trial_id


def finish(url: str, trial_id: int, state: str) -> None:
    with sessions(url).begin() as session:
        record = session.get(TrialRecord, trial_id)
        record.state, record.value = state, 1.0 if state == "COMPLETE" else None


def stage_counts(study: StudyOut) -> dict[str, tuple[int, int, int]]:
    return {stage.stage: (stage.settled, stage.planned, stage.running) for stage in study.stages}


def test_eta_runs_the_remaining_trials_concurrency_at_a_time():
    assert estimated_seconds_left(10.0, [], remaining=10, concurrency=2) == 50  # not 100
    assert estimated_seconds_left(10.0, [], remaining=10, concurrency=1) == 100
    assert estimated_seconds_left(10.0, [4.0, 4.0], remaining=8, concurrency=2) == 46  # 6 s left, then 4 rounds
    assert estimated_seconds_left(10.0, [], remaining=3, concurrency=2) == 20  # the third waits for a slot
    assert estimated_seconds_left(10.0, [], remaining=1, concurrency=2) == 10


def test_eta_of_running_trials_only_takes_what_they_lack_of_the_mean():
    assert estimated_seconds_left(10.0, [15.0, 2.0], remaining=0, concurrency=2) == 8  # one is overdue
    assert estimated_seconds_left(10.0, [15.0, 2.0], remaining=1, concurrency=2) == 10
    # Three running for two slots: the next trial starts when the second of them ends.
    assert estimated_seconds_left(10.0, [1.0, 2.0, 3.0], remaining=2, concurrency=2) == 19
    assert estimated_seconds_left(10.0, [], remaining=0, concurrency=2) == 0


def test_eta_is_unknown_until_a_trial_has_finished():
    assert estimated_seconds_left(None, [3.0, 3.0], remaining=5, concurrency=2) is None


def test_a_resumed_study_counts_its_interrupted_trials_once(storage_url):
    """Interrupted trials were run again: they do not count, so 4 settled of 4 planned is 100%, not 150%."""
    add_study(storage_url, "resumed", status="complete", tuning={"trials": 4, "concurrency": 2})
    for state, interrupted in [("FAIL", True), ("FAIL", True), ("COMPLETE", False), ("COMPLETE", False),
                               ("PRUNED", False), ("FAIL", False)]:
        add_trial(storage_url, "resumed", "tune", state, interrupted=interrupted)
    for read in (get_study(storage_url, "resumed"), list_studies(storage_url).items[0]):
        study = StudyOut.of(read)
        assert (study.trials_finished, study.trials_expected, study.progress) == (4, 4, 1.0)
        assert stage_counts(study) == {"tune": (4, 4, 0)}
        assert study.current_stage is None and study.eta_seconds is None
        assert study.counts["FAIL"] == 3  # the tuning trials by state are still all there


def test_a_study_is_counted_from_its_own_trials_only(storage_url):
    """Another study's interrupted trials and later stages never reach this study's progress (nor fail a read)."""
    add_study(storage_url, "quiet", status="complete", tuning={"trials": 1, "concurrency": 1})
    add_trial(storage_url, "quiet", "tune", "COMPLETE")
    add_study(storage_url, "busy", reruns={"top": 1, "seeds": 2}, tuning={"trials": 1, "concurrency": 1})
    add_trial(storage_url, "busy", "tune", "FAIL", interrupted=True)
    add_trial(storage_url, "busy", "rerun", "COMPLETE")
    (quiet,) = [StudyOut.of(s) for s in list_studies(storage_url, name_contains="quiet").items]
    assert stage_counts(quiet) == {"tune": (1, 1, 0)} and quiet.progress == 1.0
    assert stage_counts(StudyOut.of(get_study(storage_url, "quiet"))) == {"tune": (1, 1, 0)}


def test_the_eta_of_a_resumed_study_comes_from_its_trials_not_its_first_start(storage_url):
    """10 planned, 3 settled in 10 s each, 2 running for 4 s, 2 at a time: 6 s, then 3 rounds of 10 s for the
    5 not started. Interrupted trials neither count nor set the pace, and the day since the study was first
    started does not either."""
    add_study(storage_url, "resumed", tuning={"trials": 10, "concurrency": 2})
    for state in ("COMPLETE", "COMPLETE", "FAIL"):
        add_trial(storage_url, "resumed", "tune", state)
    for _ in range(2):
        add_trial(storage_url, "resumed", "tune", "FAIL", interrupted=True, seconds=1000)
        add_trial(storage_url, "resumed", "tune", "RUNNING", seconds=4)
    study = StudyOut.of(get_study(storage_url, "resumed"))
    assert (study.trials_finished, study.trials_expected, study.progress) == (3, 10, 0.3)
    assert stage_counts(study) == {"tune": (3, 10, 2)} and study.current_stage == "tune"
    assert 20 < study.eta_seconds <= 36  # less by the time this test took since the rows were written
    assert study.stages[0].eta_seconds == study.eta_seconds


def test_reruns_and_dynamic_evaluation_are_counted_per_stage(storage_url):
    """The plan covers every stage the spec asks for; the API, the list and the dashboard show one count."""
    add_study(storage_url, "staged", tuning={"trials": 2, "concurrency": 2}, **STAGED)
    for _ in range(2):
        add_trial(storage_url, "staged", "tune", "COMPLETE")
    add_trial(storage_url, "staged", "rerun", "COMPLETE", seconds=20)
    add_trial(storage_url, "staged", "rerun", "FAIL", interrupted=True)
    running = add_trial(storage_url, "staged", "rerun", "RUNNING", seconds=5)
    study = StudyOut.of(get_study(storage_url, "staged"))
    assert stage_counts(study) == {"tune": (2, 2, 0), "rerun": (1, 3, 1), "dyneval": (0, 2, 0)}
    assert (study.trials_finished, study.trials_expected) == (3, 7)
    assert study.progress == pytest.approx(3 / 7)
    assert study.current_stage == "rerun" and study.eta_seconds == pytest.approx(20, abs=0.01)  # not tuning's 10 s
    assert StudyOut.of(list_studies(storage_url).items[0]).progress == study.progress
    facts = render("_study_facts.html", study=_study(get_study(storage_url, "staged")))
    assert 'value="0.429"' in facts and "3 / 7" in facts  # the bar, a <progress> element (no inline style)
    assert "tuning 2/2 · reruns 1/3 · dynamic evaluation 0/2" in facts and "time left in reruns" in facts

    finish(storage_url, running, "COMPLETE")
    add_trial(storage_url, "staged", "rerun", "COMPLETE")
    for state, interrupted in [("COMPLETE", False), ("FAIL", True), ("PRUNED", False)]:
        add_trial(storage_url, "staged", "dyneval", state, interrupted=interrupted)
    study = StudyOut.of(get_study(storage_url, "staged"))
    assert stage_counts(study) == {"tune": (2, 2, 0), "rerun": (3, 3, 0), "dyneval": (2, 2, 0)}
    assert (study.trials_finished, study.trials_expected, study.progress) == (7, 7, 1.0)
    assert study.current_stage is None and study.eta_seconds is None


def test_a_family_without_a_complete_trial_plans_no_reruns_for_it():
    """Reruns repeat complete tuning trials and stage 2 adapts complete reruns: once the earlier stage is
    done, a family that found none has nothing planned, so the study can still reach 100%."""
    spec = parse_spec({**TINY_SPEC, **STAGED, "tuning": {"trials": 2}}).model_dump(mode="json")
    complete = {"lstm": 1, "mogrifier": 0}
    asked = []

    def complete_tuning(family: str, most: int) -> int:
        asked.append((family, most))
        return min(most, complete[family])

    def plan(tuning: StageTally, later: dict) -> list[tuple[str, int, int]]:
        return [(s.stage, s.planned, s.settled) for s in planned_stages(spec, tuning, later, complete_tuning)]

    assert plan(StageTally(settled=3, running=1), {}) == [("tune", 4, 3), ("rerun", 6, 0), ("dyneval", 4, 0)]
    assert asked == []  # while tuning runs, the plan is what the spec asks for
    assert plan(StageTally(settled=4), {}) == [("tune", 4, 4), ("rerun", 3, 0), ("dyneval", 4, 0)]
    assert set(asked) == {("lstm", 1), ("mogrifier", 1)}
    asked.clear()
    reruns_done = {("rerun", "lstm"): StageTally(settled=3, complete=3)}
    assert plan(StageTally(settled=4), reruns_done) == [("tune", 4, 4), ("rerun", 3, 3), ("dyneval", 2, 0)]
    assert set(asked) == {("mogrifier", 1)}  # lstm's three reruns show it had a complete trial


def ray_trial(trial_id: int, number: int) -> SimpleNamespace:
    """What the printer reads of a Ray Tune trial."""
    return SimpleNamespace(trial_id=f"ray-{trial_id}", config={"params": {"learning_rate": 0.003}, "family": "lstm",
                                                               "number": number, "optuna_trial_id": trial_id})


def test_the_printer_counts_what_this_run_does_and_labels_each_stage(storage_url, capsys):
    add_study(storage_url, "resumed", tuning={"trials": 3, "concurrency": 2}, reruns={"top": 1, "seeds": 2})
    for state, interrupted in [("COMPLETE", False), ("FAIL", True), ("COMPLETE", False)]:
        add_trial(storage_url, "resumed", "tune", state, interrupted=interrupted)
    printer = ProgressPrinter(storage_url, "resumed")
    lines = []

    def run(stage: str, number: int, state: str) -> None:
        trial_id = add_trial(storage_url, "resumed", stage, "RUNNING", seconds=0)
        printer.on_trial_start(0, [], ray_trial(trial_id, number))
        finish(storage_url, trial_id, state)
        ended = printer.on_trial_error if state == "FAIL" else printer.on_trial_complete
        ended(0, [], ray_trial(trial_id, number))
        lines.extend(capsys.readouterr().out.splitlines())

    run("tune", 3, "COMPLETE")
    assert lines[0] == "resumed: 2 of 5 trials already done (tuning 2/3, reruns 0/2); this run: 3"
    assert lines[1].startswith("start  resumed/lstm#3  learning_rate=0.003")
    assert lines[2].startswith("complete  resumed/lstm#3  val ppl 2.718  |  this run 1/3 done (1 complete, 0 pruned, "
                               "0 failed), 0 running  |  tuning 3/3, reruns 0/2  |  best 2.718 (resumed/lstm#3)")
    run("rerun", 0, "COMPLETE")
    assert lines[4].startswith("complete  resumed/lstm/rerun#0  val ppl 2.718  |  this run 2/3 done")
    assert "tuning 3/3, reruns 1/2" in lines[4]
    run("rerun", 1, "FAIL")
    assert lines[6].startswith("failed  resumed/lstm/rerun#1    |  this run 3/3 done (2 complete, 0 pruned, 1 failed)")
    assert "tuning 3/3, reruns 2/2" in lines[6] and "ETA -" in lines[6]
    counts = [tuple(map(int, found)) for line in lines for found in re.findall(r"(\d+)/(\d+)", line)]
    assert counts and all(done <= planned for done, planned in counts)


def budget_plan(families: dict[str, list[tuple[int, int]]], parallel_trials: int = 2) -> dict:
    """A stored plan's fields the ETA reads: per family, its rungs as (configurations, tokens trained to)."""
    return {"parallel_trials": parallel_trials,
            "families": [{"family": family, "rungs": [{"configurations": c, "tokens": t} for c, t in rungs]}
                         for family, rungs in families.items()]}


def test_a_budgeted_study_s_eta_is_the_tokens_its_rungs_lack_at_each_family_s_pace():
    plan = budget_plan({"lstm": [(3, 100), (1, 300)], "mogrifier": [(3, 100), (1, 300)]})  # 500 tokens each
    # lstm 250 of 500 at 0.2 s a token, mogrifier 100 of 500 at 0.4 s: 50 s + 160 s over 2 slots
    assert budgeted_seconds_left(plan, {"lstm": (250, 50.0), "mogrifier": (100, 40.0)}) == pytest.approx(105)
    # a family yet to report goes at the others' pace; one done adds nothing
    assert budgeted_seconds_left(plan, {"lstm": (500, 100.0)}) == pytest.approx(500 * 0.2 / 2)
    assert budgeted_seconds_left(plan, {}) is None and budgeted_seconds_left(plan, {"lstm": (0, 0.0)}) is None


def test_a_budgeted_study_s_eta_comes_from_its_plan_not_its_configurations_mean(storage_url):
    """Three configurations trained to the first rung (100 tokens, 10 s each), one promoted to 300 tokens: the
    configurations' mean duration says nothing of the longer top rung, the tokens do."""
    training = {name: value for name, value in TINY_SPEC["training"].items() if name != "turns"}  # rungs decide
    add_study(storage_url, "budgeted", compute_budget={"wall_minutes": 10}, training=training,
              tuning={"concurrency": 1})
    plan = budget_plan({"lstm": [(3, 100), (1, 300)]}, parallel_trials=1)
    with sessions(storage_url).begin() as session:
        session.scalar(select(StudyRecord).where(StudyRecord.name == "budgeted")).plan = plan
    trained = [add_trial(storage_url, "budgeted", "tune", state) for state in ("PRUNED", "PRUNED", "RUNNING")]
    with sessions(storage_url).begin() as session:
        for trial_id in trained:
            record = session.get(TrialRecord, trial_id)
            record.tokens, record.wall_seconds = 100, 10.0
    study = StudyOut.of(get_study(storage_url, "budgeted"))
    assert study.current_stage == "tune" and study.eta_seconds == pytest.approx(200 * 0.1)
