"""A sampler that learns from the rungs of successive halving, as BOHB does (Falkner et al. 2018).

Under successive halving most configurations stop at a low rung, and those that go on are scored again higher up;
a sampler that saw only finished trials would learn from the finalists alone. This one shows its model (Optuna's
GPSampler or TPESampler) the results at one rung, as if they were finished trials: the highest rung that enough
configurations have reached (BOHB's choice), else the lowest. Results at one rung are comparable: every
configuration there has trained the same steps and been scored on the same validation tokens. Configurations
proposed but not yet scored there are shown as running, so a GP's batch acquisition spreads its proposals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState


class RungSampler(BaseSampler):
    """Proposes from `model`, fitted to the results at the turns that end the rungs (`rung_turns`, lowest first)."""

    def __init__(self, model: BaseSampler, rung_turns: Sequence[int], enough: int) -> None:
        self._model = model
        self._rung_turns = list(rung_turns)
        self._enough = max(1, enough)  # results a rung needs before the model is fitted to it
        self._view: tuple[int, optuna.Study, FrozenTrial] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_view": None}  # Ray saves searchers; an in-memory study does not pickle

    def reseed_rng(self) -> None:
        self._model.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        view, view_trial = self._view_of(study, trial)
        return self._model.infer_relative_search_space(view, view_trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        view, view_trial = self._view_of(study, trial)
        return self._model.sample_relative(view, view_trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        view, view_trial = self._view_of(study, trial)
        return self._model.sample_independent(view, view_trial, param_name, param_distribution)

    def rung_of_the_model(self, trials: Sequence[FrozenTrial]) -> int:
        """The highest rung with `enough` results, else the lowest."""
        counts = [sum(1 for t in trials if turn in t.intermediate_values and t.state != TrialState.FAIL)
                  for turn in self._rung_turns]
        return max((k for k, count in enumerate(counts) if count >= self._enough), default=0)

    def _view_of(self, study: optuna.Study, trial: FrozenTrial) -> tuple[optuna.Study, FrozenTrial]:
        """An in-memory study holding each configuration's result at the model's rung as a finished trial (built once
        per proposal), with `trial` in it as a running trial."""
        if self._view is not None and self._view[0] == trial._trial_id:
            return self._view[1], self._view[2]
        trials = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        turn = self._rung_turns[self.rung_of_the_model(trials)]
        view = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="minimize")
        for other in trials:
            if other.state == TrialState.FAIL or not other.params:
                continue
            value = other.intermediate_values.get(turn)
            if value is not None:
                view.add_trial(optuna.trial.create_trial(params=other.params, distributions=other.distributions,
                                                         value=value))
            elif other.state in (TrialState.RUNNING, TrialState.WAITING):
                view.add_trial(optuna.trial.create_trial(params=other.params, distributions=other.distributions,
                                                         state=TrialState.RUNNING))
        view.add_trial(optuna.trial.create_trial(state=TrialState.RUNNING))
        view_trial = view.get_trials(deepcopy=False)[-1]
        self._view = (trial._trial_id, view, view_trial)
        return view, view_trial
