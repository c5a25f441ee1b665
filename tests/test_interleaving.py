"""Families interleaved: one Ray Tune run proposes trials of all families in turn, each family stopped early
only by its own scheduler, the CPU kernels ready before any trial's clock starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
import pytest
from ray.tune import Callback
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, MedianStoppingRule, TrialScheduler
from ray.tune.search import Searcher
from sqlalchemy import select

from lm_tuner.models import cpu_kernels
from lm_tuner.tuner.run import cancellation, tuning
from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.run.interleaving import FamilyScheduler, FamilyShare, InterleavedSearcher
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.space import distributions
from lm_tuner.tuner.store.engine import ensure_schema, optuna_storage, sessions
from lm_tuner.tuner.store.lifecycle import cancel_study
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord

EVENTS: list[str] = []  # module-level: Ray pickles callbacks, so an instance's own list would be a copy's


class FakeSearcher(Searcher):
    """Proposes numbered trials of one family and keeps what it is told about them."""

    def __init__(self, family: str) -> None:
        super().__init__(metric="loss", mode="min")
        self.family, self.proposed, self.results, self.completed = family, 0, [], []

    def suggest(self, trial_id: str) -> dict[str, Any]:
        self.proposed += 1
        return {"family": self.family, "number": self.proposed - 1}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.results.append(trial_id)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        self.completed.append(trial_id)


@dataclass(eq=False)
class FakeTrial:
    trial_id: str
    family: str
    status: str = Trial.PENDING
    config: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.config = {"family": self.family}


class FakeController:
    def __init__(self, trials: list[FakeTrial]) -> None:
        self.trials = trials

    def get_trials(self) -> list[FakeTrial]:
        return self.trials

    def get_live_trials(self) -> set[FakeTrial]:
        return {trial for trial in self.trials if trial.status != Trial.TERMINATED}


def test_each_trial_goes_to_the_family_with_the_fewest_and_its_results_come_back_to_it():
    lstm, mogrifier, residual = FakeSearcher("lstm"), FakeSearcher("mogrifier"), FakeSearcher("residual")
    # A resumed study: lstm has settled 2 of 4, mogrifier none, residual all of them.
    searcher = InterleavedSearcher([FamilyShare("lstm", lstm, trials=2, settled=2),
                                    FamilyShare("mogrifier", mogrifier, trials=4, settled=0),
                                    FamilyShare("residual", residual, trials=0, settled=4)])
    proposed = [(config["family"], config["number"]) for config in (searcher.suggest(f"t{i}") for i in range(6))]
    # mogrifier catches up first; on a tie the family listed first goes first
    assert proposed == [("mogrifier", 0), ("mogrifier", 1), ("lstm", 0), ("mogrifier", 2), ("lstm", 1),
                        ("mogrifier", 3)]
    assert searcher.suggest("t6") == Searcher.FINISHED and residual.proposed == 0

    searcher.on_trial_result("t2", {"loss": 1.0})
    searcher.on_trial_complete("t1", {"loss": 1.0})
    assert (lstm.results, mogrifier.completed, mogrifier.results, lstm.completed) == (["t2"], ["t1"], [], [])


def test_on_a_tie_the_family_whose_trials_took_longest_goes_first_once_each_has_finished_one():
    now = [0.0]
    lstm, mogrifier = FakeSearcher("lstm"), FakeSearcher("mogrifier")
    shares = [FamilyShare("lstm", lstm, trials=3), FamilyShare("mogrifier", mogrifier, trials=3)]
    searcher = InterleavedSearcher(shares, clock=lambda: now[0])

    def propose(trial_id: str) -> str:
        return searcher.suggest(trial_id)["family"]

    assert [propose("l0"), propose("m0")] == ["lstm", "mogrifier"]  # no trial has finished: the families' order
    now[0] = 10.0
    searcher.on_trial_complete("l0", {"loss": 1.0})
    assert propose("l1") == "lstm"  # the only family with the fewest trials
    now[0] = 12.0
    assert propose("m1") == "mogrifier"
    now[0] = 17.0
    searcher.on_trial_complete("m0", {"loss": 1.0})  # 17 s against the lstm's 10 s
    searcher.on_trial_complete("l1", {"loss": 1.0})
    assert [propose("m2"), propose("l2")] == ["mogrifier", "lstm"]  # the longer trials start first
    assert [share.seconds for share in shares] == [[10.0, 7.0], [17.0]]
    assert (lstm.completed, mogrifier.completed) == (["l0", "l1"], ["m0"])


def test_a_searcher_needs_one_share_per_family():
    with pytest.raises(ValueError, match="one share per family"):
        InterleavedSearcher([FamilyShare("lstm", FakeSearcher("lstm"), 1),
                             FamilyShare("lstm", FakeSearcher("lstm"), 1)])


def early_stopping(method: str) -> TrialScheduler:
    if method == "asha":
        return ASHAScheduler(time_attr="turn", metric="loss", mode="min", max_t=8, grace_period=1,
                             reduction_factor=2)
    return MedianStoppingRule(time_attr="turn", metric="loss", mode="min", grace_period=1, min_samples_required=1)


def decisions_after_a_good_mogrifier(scheduler: TrialScheduler) -> dict[str, list[str]]:
    """Decisions on two poor lstm trials (loss 5, then 6) once a mogrifier trial reached loss 1."""
    mogrifier, lstm_first, lstm_second = FakeTrial("m0", "mogrifier"), FakeTrial("l0", "lstm"), FakeTrial("l1", "lstm")
    controller = FakeController([mogrifier, lstm_first, lstm_second])
    for trial in controller.trials:
        scheduler.on_trial_add(controller, trial)
        trial.status = Trial.RUNNING
    for turn in (1, 2):
        scheduler.on_trial_result(controller, mogrifier, {"turn": turn, "loss": 1.0})
    scheduler.on_trial_complete(controller, mogrifier, {"turn": 2, "loss": 1.0})
    mogrifier.status = Trial.TERMINATED
    decisions: dict[str, list[str]] = {}
    for trial, loss in ((lstm_first, 5.0), (lstm_second, 6.0)):
        made = decisions.setdefault(trial.trial_id, [])
        for turn in (1, 2):
            made.append(scheduler.on_trial_result(controller, trial, {"turn": turn, "loss": loss}))
            if made[-1] == TrialScheduler.STOP:  # Ray reports nothing more of a stopped trial
                break
    return decisions


@pytest.mark.parametrize("method", ["asha", "median"])
def test_early_stopping_compares_a_trial_only_with_its_own_family(method):
    # One scheduler for both families stops the first lstm trial for being worse than a mogrifier.
    assert decisions_after_a_good_mogrifier(early_stopping(method))["l0"] == [TrialScheduler.STOP]
    routed = FamilyScheduler({"lstm": early_stopping(method), "mogrifier": early_stopping(method)})
    decisions = decisions_after_a_good_mogrifier(routed)
    assert decisions["l0"] == [TrialScheduler.CONTINUE] * 2  # no lstm trial to lose to
    assert decisions["l1"] == [TrialScheduler.STOP]  # worse than the first lstm trial: still stopped
    assert "lstm: " in routed.debug_string() and "mogrifier: " in routed.debug_string()


def test_trials_start_in_the_order_they_were_proposed():
    trials = [FakeTrial("l0", "lstm", Trial.RUNNING), FakeTrial("m0", "mogrifier"), FakeTrial("l1", "lstm")]
    controller = FakeController(trials)
    routed = FamilyScheduler({"lstm": early_stopping("asha"), "mogrifier": None})
    assert routed.metric == "loss" and routed.set_search_properties(None, None)
    assert routed.choose_trial_to_run(controller) is trials[1]
    trials[1].status = Trial.RUNNING
    assert routed.choose_trial_to_run(controller) is trials[2]
    trials[2].status = Trial.RUNNING
    assert routed.choose_trial_to_run(controller) is None
    with pytest.raises(KeyError, match="family 'residual'"):
        routed.on_trial_add(controller, FakeTrial("r0", "residual"))


@pytest.mark.parametrize("gpus", [0, 1])
def test_the_kernels_are_ready_before_tuning_starts_when_trials_run_on_cpus(gpus, monkeypatch, sqlite_url, tiny_spec,
                                                                            tmp_path):
    events: list[Any] = []
    monkeypatch.setattr(cpu_kernels, "cpu_extension", lambda: events.append("kernels"))
    monkeypatch.setattr(tuning, "run_experiments", lambda experiments, *_: events.append(
        [(e.family, e.trials, e.settled) for e in experiments]))
    ensure_schema(sqlite_url)
    spec = parse_spec(tiny_spec(resources={"gpus_per_trial": gpus}))
    tuning.tune_families(spec, 20, Settings(sqlite_url, tmp_path), ())
    assert events == (["kernels"] if gpus == 0 else []) + [[("lstm", 1, 0), ("mogrifier", 1, 0)]]


class Recorder(Callback):
    """Notes trial starts in EVENTS; cancels the study once `cancel_after` trials have completed."""

    def __init__(self, url: str = "", cancel_after: int = 0) -> None:
        self._url, self._cancel_after, self._completed = url, cancel_after, 0

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        EVENTS.append(f"start {trial.config['family']}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._completed += 1
        if self._completed == self._cancel_after:
            cancel_study(self._url, "tiny")


def tuning_trials(url: str) -> list[TrialRecord]:
    """The study's tuning trials in the order they were proposed (Optuna's ids count up across studies)."""
    with sessions(url)() as session:
        return list(session.scalars(select(TrialRecord).where(TrialRecord.stage == "tune")
                                    .order_by(TrialRecord.trial_id)))


def interleaved_spec(tiny_spec, trials: int) -> str:
    return tiny_spec(tuning={"sampler": "random", "trials": trials, "concurrency": 2})


@pytest.mark.slow
def test_families_take_turns_in_shared_slots_after_the_kernels_are_ready(ray_cluster, monkeypatch, sqlite_url,
                                                                        tiny_spec, tmp_path):
    build = cpu_kernels.cpu_extension
    monkeypatch.setattr(cpu_kernels, "cpu_extension", lambda: EVENTS.append("kernels") or build())
    EVENTS.clear()
    document = interleaved_spec(tiny_spec, 3)
    assert launch_study(parse_spec(document), document, Settings(sqlite_url, tmp_path / "artifacts"),
                        callbacks=[Recorder()]) == "complete"
    assert EVENTS[0] == "kernels" and EVENTS.count("kernels") == 1
    # Proposed strictly in turn (which family of a turn goes first depends on how long their trials took); trials
    # proposed together may start in either order, so at every start each family has started as many trials as
    # the other, give or take the 2 slots.
    proposed = [(t.family, t.number) for t in tuning_trials(sqlite_url)]
    assert [set(proposed[turn:turn + 2]) for turn in range(0, 6, 2)] == [{("lstm", n), ("mogrifier", n)}
                                                                         for n in range(3)]
    starts = EVENTS[1:]
    assert len(starts) == 6 and all(abs(starts[:n].count("start lstm") - starts[:n].count("start mogrifier")) <= 2
                                    for n in range(1, 7)), starts
    # the slots are shared: trials of the two families ran at the same time
    frozen = {f: optuna.load_study(study_name=f"tiny/{f}", storage=sqlite_url).get_trials()
              for f in ("lstm", "mogrifier")}
    assert any(a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete
               for a in frozen["lstm"] for b in frozen["mogrifier"])


@pytest.mark.slow
def test_a_study_stopped_early_has_given_each_family_as_many_trials_give_or_take_the_slots(ray_cluster, sqlite_url,
                                                                                         tiny_spec, tmp_path,
                                                                                         monkeypatch):
    # The controller looks for a cancel every POLL_SECONDS; tiny trials are fast enough to finish all 20 in that
    # time (a fresh-clone run did), so it looks at once here: the test is about the families' shares.
    monkeypatch.setattr(cancellation, "POLL_SECONDS", 0.0)
    document = interleaved_spec(tiny_spec, 10)
    assert launch_study(parse_spec(document), document, Settings(sqlite_url, tmp_path / "artifacts"),
                        callbacks=[Recorder(sqlite_url, cancel_after=3)]) == "cancelled"
    trials = tuning_trials(sqlite_url)
    counts = {family: sum(t.family == family for t in trials) for family in ("lstm", "mogrifier")}
    assert 0 < len(trials) < 20 and abs(counts["lstm"] - counts["mogrifier"]) <= 2, counts
    settled = {family: sum(t.family == family and not t.interrupted for t in trials) for family in counts}
    assert abs(settled["lstm"] - settled["mogrifier"]) <= 2, settled


@pytest.mark.slow
def test_a_resumed_study_fills_the_family_that_is_behind_first(ray_cluster, sqlite_url, tiny_spec, tmp_path):
    document = interleaved_spec(tiny_spec, 3)
    spec = parse_spec(document)
    ensure_schema(sqlite_url)
    # What an earlier run left: two lstm trials done, no mogrifier trial yet.
    lstm = optuna.create_study(study_name="tiny/lstm", storage=optuna_storage(sqlite_url))
    for rate in (0.002, 0.005):
        lstm.add_trial(optuna.trial.create_trial(params={"learning_rate": rate}, value=3.0,
                                                 distributions=distributions(spec, "lstm")))
    assert launch_study(spec, document, Settings(sqlite_url, tmp_path / "artifacts")) == "complete"
    assert [(t.family, t.number) for t in tuning_trials(sqlite_url)] == [
        ("mogrifier", 0), ("mogrifier", 1), ("lstm", 2), ("mogrifier", 2)]
    with sessions(sqlite_url)() as session:
        assert session.scalar(select(StudyRecord.status).where(StudyRecord.name == "tiny")) == "complete"
