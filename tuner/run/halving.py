"""Successive halving of one family's configurations, rung by rung, as a Ray Tune searcher.

A configuration is one Optuna trial; each stretch of its training up to a rung's end is one Ray Tune trial (a
segment), which resumes the configuration from its latest checkpoint and stops at that rung's step
(tuner.run.trial, `until_step`), so a configuration promoted through every rung trains exactly as one run of the
top rung's length. The rungs close synchronously: once every configuration of rung k has its result at the rung's
end (or has failed), the best `configurations_at(k + 1)` go on and the rest are pruned (Optuna's PRUNED, their
rung result kept as intermediate values). The top rung's configurations end COMPLETE. New configurations are
proposed while the lowest rung is not full, by a sampler fitted to the rung results so far (tuner.run.rung_sampler).

The state lives in the database: a configuration's rung is its Optuna user attribute `rung`, its results are its
intermediate values at the rungs' turns, and a configuration of a study stopped midway stays RUNNING, so that a
continued study rebuilds the brackets and resumes every unfinished segment where its checkpoint left it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher

from lm_tuner.tuner.run.reporting import FAILED, INFRASTRUCTURE, OBJECTIVE, TURN
from lm_tuner.tuner.run.search import NewTrialHook, StoreFaults
from lm_tuner.tuner.spec.budget_plan import FamilyBudget
from lm_tuner.tuner.store.engine import optuna_storage
from lm_tuner.tuner.store.ledger import TrialLedger
from lm_tuner.tuner.store.optuna_internals import storage_trial_id

RUNG = "rung"
"""The Optuna user attribute holding the rung a configuration was last sent to train to."""


@dataclass
class Configuration:
    number: int
    trial_id: int
    params: dict[str, Any]
    seed: int
    rung: int = 0  # the rung it trains (or has trained) to
    scores: dict[int, float] = field(default_factory=dict)  # its result at each rung it reached
    state: TrialState = TrialState.RUNNING

    @property
    def settled(self) -> bool:
        return self.state != TrialState.RUNNING

    def done_with(self, rung: int) -> bool:
        """Whether it has its result at `rung`, or will never have it."""
        return rung in self.scores or self.settled


class HalvingSearcher(Searcher):
    """One family's bracket: proposes segments (new configurations at the lowest rung, promotions, unfinished
    segments of a continued study), None while a rung waits for its last results, FINISHED when all are settled."""

    def __init__(self, *, family: str, budget: FamilyBudget, steps_per_turn: int,
                 space: dict[str, BaseDistribution], sampler: optuna.samplers.BaseSampler, study_name: str,
                 url: str, registrar: NewTrialHook, ledger: TrialLedger,
                 points: list[dict[str, Any]] | None = None, store_faults: StoreFaults | None = None) -> None:
        super().__init__(metric=OBJECTIVE, mode="min")
        self._family, self._budget, self._space = family, budget, space
        self._rung_turns = [rung.steps // steps_per_turn for rung in budget.rungs]
        self._top = len(budget.rungs) - 1
        self._study_name, self._url = study_name, url
        self._sampler, self._registrar, self._ledger = sampler, registrar, ledger
        self._store_faults = store_faults or StoreFaults()  # once the artifact store fails, no segment starts
        self._configurations: dict[int, Configuration] = {}
        self._queued: list[int] = []  # configurations whose segment is due, in the order they became due
        self._active: dict[str, int] = {}  # Ray trial id -> configuration number
        study = self._study()
        if not study.get_trials(deepcopy=False):
            for point in points or []:
                study.enqueue_trial(point)
        self._load(study)

    # -- what Ray Tune calls

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._store_faults.seen:
            return None if self._active else Searcher.FINISHED
        if self._queued:
            return self._segment(trial_id, self._configurations[self._queued.pop(0)])
        if len(self._configurations) < self._budget.rungs[0].configurations:
            return self._segment(trial_id, self._new_configuration())
        if not self._active:  # nothing due and nothing running: no segment can start in this run
            return Searcher.FINISHED
        return None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if FAILED in result or trial_id not in self._active:
            return
        configuration = self._configurations[self._active[trial_id]]
        self._record(configuration, result[TURN], result[OBJECTIVE])

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        number = self._active.pop(trial_id, None)
        if number is None:
            return
        configuration = self._configurations[number]
        result = result or {}
        if FAILED not in result and TURN in result:
            self._record(configuration, result[TURN], result[OBJECTIVE])  # a last result handed only to this method
        if result.get(INFRASTRUCTURE):
            self._store_faults.seen = True
            return  # the store's fault: the configuration stays unsettled, and a continued study runs it on
        if error or FAILED in result:
            self._end(configuration, TrialState.FAIL, reason=result.get(FAILED))
        elif configuration.rung == self._top and result.get("finished"):
            self._end(configuration, TrialState.COMPLETE, result[OBJECTIVE])
        elif configuration.rung == self._top or configuration.rung not in configuration.scores:
            if not self._ledger.cancel_requested():
                self._queued.append(number)  # stopped short of its rung's end: its segment runs again
            return
        self._close_rungs()

    # -- progress, for the interleaving of families

    def issued_share(self) -> float:
        """The share of the family's planned training steps sent to train so far (due, running or done)."""
        rungs = self._budget.rungs
        planned = sum(r.configurations * (r.steps - (rungs[k - 1].steps if k else 0)) for k, r in enumerate(rungs))
        issued = sum(rungs[configuration.rung].steps for configuration in self._configurations.values())
        return issued / planned if planned else 1.0

    # -- the bracket

    def _segment(self, trial_id: str, configuration: Configuration) -> dict[str, Any]:
        self._active[trial_id] = configuration.number
        return {"params": configuration.params, "family": self._family, "number": configuration.number,
                "optuna_trial_id": configuration.trial_id, "seed": configuration.seed, "stage": "tune",
                "budget_steps": self._budget.top_steps, RUNG: configuration.rung,
                # the top rung runs to the end of the budget, and through fine-tuning where the schedule has it
                "until_step": None if configuration.rung == self._top else self._budget.rungs[configuration.rung].steps}

    def _new_configuration(self) -> Configuration:
        study = self._study()
        trial = study.ask(self._space)
        trial_id = storage_trial_id(trial)
        extra = self._registrar(trial_id, trial.number, trial.params)
        study._storage.set_trial_user_attr(trial_id, RUNG, 0)
        configuration = Configuration(trial.number, trial_id, trial.params, extra["seed"])
        self._configurations[trial.number] = configuration
        return configuration

    def _record(self, configuration: Configuration, turn: int, value: float) -> None:
        if not math.isfinite(value):
            return
        optuna_storage(self._url).set_trial_intermediate_value(configuration.trial_id, turn, value)
        if turn in self._rung_turns:
            configuration.scores[self._rung_turns.index(turn)] = value

    def _end(self, configuration: Configuration, state: TrialState, value: float | None = None, *,
             reason: str | None = None) -> None:
        storage = optuna_storage(self._url)
        if state == TrialState.PRUNED and configuration.scores:
            storage.set_trial_user_attr(configuration.trial_id, "last_value", configuration.scores[max(
                configuration.scores)])
        storage.set_trial_state_values(configuration.trial_id, state, None if value is None else [value])
        self._ledger.ended(configuration.trial_id, state, value, reason=reason)
        configuration.state = state

    def _close_rungs(self) -> None:
        """Promote the best of every rung whose configurations are all done with it, and prune the rest."""
        rungs = self._budget.rungs
        for k in range(len(rungs) - 1):
            entrants = [c for c in self._configurations.values() if c.rung >= k]
            if len(entrants) < rungs[k].configurations or not all(c.done_with(k) for c in entrants):
                return  # the rungs above cannot close before this one
            promoted = [c for c in entrants if c.rung > k]
            ranked = sorted((c for c in entrants if c.rung == k and k in c.scores and not c.settled),
                            key=lambda c: c.scores[k])
            for configuration in ranked[:max(0, rungs[k + 1].configurations - len(promoted))]:
                configuration.rung = k + 1
                optuna_storage(self._url).set_trial_user_attr(configuration.trial_id, RUNG, k + 1)
                self._queued.append(configuration.number)
            for configuration in ranked[max(0, rungs[k + 1].configurations - len(promoted)):]:
                self._end(configuration, TrialState.PRUNED)

    def _load(self, study: optuna.Study) -> None:
        """The bracket as the database holds it: every configuration proposed so far, where it is and what it
        scored; unfinished segments are due again."""
        for trial in study.get_trials(deepcopy=False):
            if trial.state == TrialState.WAITING:
                continue  # an initial point not proposed yet
            configuration = Configuration(
                trial.number, storage_trial_id(trial), trial.params, trial.user_attrs.get("seed", 0),
                rung=int(trial.user_attrs.get(RUNG, 0)),
                scores={k: trial.intermediate_values[turn] for k, turn in enumerate(self._rung_turns)
                        if turn in trial.intermediate_values},
                state=trial.state)
            self._configurations[trial.number] = configuration
            if not configuration.settled and (configuration.rung == self._top or
                                              configuration.rung not in configuration.scores):
                self._queued.append(trial.number)  # its segment was cut short: it resumes from its checkpoint
        self._close_rungs()

    def _study(self) -> optuna.Study:
        return optuna.create_study(study_name=self._study_name, storage=optuna_storage(self._url),
                                   sampler=self._sampler, direction="minimize", load_if_exists=True)
