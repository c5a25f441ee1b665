"""Several families' Optuna studies in one Ray Tune run: trials proposed in turn, stopped within their family.

The families share the run's concurrency slots. Each new trial goes to the family with the fewest trials so
far (those the database has settled plus those proposed in this run), so at any moment every family has had the
same number of trials give or take the number of slots, and a resumed study fills the family that is behind first.
Ties go to the family whose trials have taken longest in this run (in the families' order until each tied family
has finished one): the longer trials start first, so that a short one, not a long one, is what runs alone at the
end of the run. In simulated runs (200 each, trial times spread by 30%) with two families of 10 and 17 s trials,
6 each, on two slots, that kept the slots 94.6% busy instead of 91.3%; with three or five families it made no
difference. A family's own trials keep their order and numbering. Each family keeps its own searcher (its Optuna
study, sampler, space and trial numbering) and its own early-stopping scheduler: a trial is only ever compared
with trials of its own family, since one family's results say nothing about which of another family's
configurations are bad.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from lm_tuner.tuner.run.reporting import OBJECTIVE


@dataclass
class FamilyShare:
    """One family's part of the run: its searcher, the trials it proposes in this run and those already settled."""

    family: str
    searcher: Searcher
    trials: int
    settled: int = 0
    seconds: list[float] = field(default_factory=list)
    """How long each of its trials that finished in this run took, from its proposal to its end."""

    def mean_seconds(self) -> float | None:
        return sum(self.seconds) / len(self.seconds) if self.seconds else None


class InterleavedSearcher(Searcher):
    """Proposes each trial from the family that has had the fewest, and routes its results back to that family.

    (No attribute may be called `searcher`: Ray takes an object with one for a wrapper such as its
    ConcurrencyLimiter when it saves the search state.)
    """

    def __init__(self, shares: Sequence[FamilyShare], clock: Callable[[], float] = time.monotonic) -> None:
        families = [share.family for share in shares]
        if not shares or len(set(families)) != len(families):
            raise ValueError(f"families: one share per family is needed, got {families}")
        super().__init__(metric=OBJECTIVE, mode="min")
        self._shares = list(shares)
        self._proposed = dict.fromkeys(families, 0)
        self._owners: dict[str, FamilyShare] = {}
        self._clock = clock
        self._proposed_at: dict[str, float] = {}
        self._finished: set[str] = set()  # families whose searcher has nothing more to propose in this run

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        results = [share.searcher.set_search_properties(metric, mode, config, **spec) for share in self._shares]
        return all(results)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        candidates = self._candidates()
        if not candidates:
            return Searcher.FINISHED
        for share in candidates:
            config = share.searcher.suggest(trial_id)
            if isinstance(config, dict):
                self._owners[trial_id] = share
                self._proposed[share.family] += 1
                self._proposed_at[trial_id] = self._clock()
                return config
            if not _waits(share):
                return config
            if config == Searcher.FINISHED:
                self._finished.add(share.family)
        return None if self._candidates() else Searcher.FINISHED

    def _candidates(self) -> list[FamilyShare]:
        """The families to ask, in order: successive-halving families (which may have nothing to start while a rung
        waits for its last results) by the share of their plan sent to train, least first; else the one family
        next_family picks."""
        if any(_waits(share) for share in self._shares):
            open_shares = [share for share in self._shares
                           if share.family not in self._finished and self._proposed[share.family] < share.trials]
            return sorted(open_shares, key=lambda share: share.searcher.issued_share())
        share = self.next_family()
        return [] if share is None else [share]

    def next_family(self) -> FamilyShare | None:
        """The family with the fewest trials settled or proposed, among those with trials left to propose in this
        run; on a tie the one whose trials took longest, where each tied family has finished one, else the first
        listed. None when no family has trials left to propose."""
        open_shares = [share for share in self._shares if self._proposed[share.family] < share.trials]
        if not open_shares:
            return None
        fewest = min(map(self._trials_so_far, open_shares))
        tied = [share for share in open_shares if self._trials_so_far(share) == fewest]
        if any(share.mean_seconds() is None for share in tied):
            return tied[0]
        return max(tied, key=FamilyShare.mean_seconds)

    def _trials_so_far(self, share: FamilyShare) -> int:
        return share.settled + self._proposed[share.family]

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self._owners:
            self._owners[trial_id].searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._owners:
            share = self._owners[trial_id]
            share.seconds.append(self._clock() - self._proposed_at.pop(trial_id))
            share.searcher.on_trial_complete(trial_id, result=result, error=error)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as file:
            pickle.dump(self.__dict__.copy(), file)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as file:
            self.__dict__.update(pickle.load(file))


class FamilyScheduler(TrialScheduler):
    """Hands each trial to its family's scheduler (by `trial.config["family"]`), which sees only that family's
    trials; among the trials the families' schedulers would start next, the one proposed first starts."""

    def __init__(self, schedulers: Mapping[str, TrialScheduler | None]) -> None:
        if not schedulers:
            raise ValueError("schedulers: at least one family is needed")
        super().__init__()
        self._schedulers = {family: scheduler or FIFOScheduler() for family, scheduler in schedulers.items()}

    @property
    def metric(self) -> str | None:
        return next(iter(self._schedulers.values())).metric

    @property
    def supports_buffered_results(self) -> bool:
        return all(scheduler.supports_buffered_results for scheduler in self._schedulers.values())

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        results = [scheduler.set_search_properties(metric, mode, **spec) for scheduler in self._schedulers.values()]
        return all(results)

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        self._route(trial).on_trial_add(FamilyView(tune_controller, _family(trial)), trial)

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        self._route(trial).on_trial_error(FamilyView(tune_controller, _family(trial)), trial)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        return self._route(trial).on_trial_result(FamilyView(tune_controller, _family(trial)), trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        self._route(trial).on_trial_complete(FamilyView(tune_controller, _family(trial)), trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        self._route(trial).on_trial_remove(FamilyView(tune_controller, _family(trial)), trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        chosen = [scheduler.choose_trial_to_run(FamilyView(tune_controller, family))
                  for family, scheduler in self._schedulers.items()]
        position = {id(trial): index for index, trial in enumerate(tune_controller.get_trials())}
        return min((trial for trial in chosen if trial is not None), key=lambda trial: position[id(trial)],
                   default=None)

    def debug_string(self) -> str:
        return "\n".join(f"{family}: {scheduler.debug_string()}" for family, scheduler in self._schedulers.items())

    def _route(self, trial: Trial) -> TrialScheduler:
        family = _family(trial)
        if family not in self._schedulers:
            raise KeyError(f"trial {trial.trial_id} is of family {family!r}, which this run does not schedule "
                           f"(it schedules {', '.join(self._schedulers)})")
        return self._schedulers[family]


class FamilyView:
    """The tune controller as one family's scheduler sees it: the trials of that family only."""

    def __init__(self, tune_controller: Any, family: str) -> None:
        self._controller = tune_controller
        self._family = family

    def get_trials(self) -> list[Trial]:
        return [trial for trial in self._controller.get_trials() if _family(trial) == self._family]

    def get_live_trials(self) -> set[Trial]:
        return {trial for trial in self._controller.get_live_trials() if _family(trial) == self._family}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._controller, name)


def _waits(share: FamilyShare) -> bool:
    """Whether the family's searcher may have nothing to start for a while and more later (successive halving)."""
    return hasattr(share.searcher, "issued_share")


def _family(trial: Trial) -> str:
    return trial.config["family"]
