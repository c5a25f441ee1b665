"""Ray Tune's OptunaSearch, made to record trials honestly and to tell each trial who it is.

Ray's OptunaSearch marks every trial that returned a metric COMPLETE — also one that a scheduler
stopped early or that crashed after reporting. Here only a trial that ran all its turns is
COMPLETE; one stopped early is PRUNED (its last value kept as the user attribute `last_value`);
one that raised is FAIL and never feeds the sampler a number; one stopped because the study was
cancelled, or failed by the machine rather than its configuration (a full artifact store), is FAIL too, marked
interrupted so that resuming the study runs it again.

This is the one adapter of Ray Tune's private state: it reads OptunaSearch's `_ot_trials`, `_ot_study`, `_storage`
and `_completed_trials` (supported: the `ray[tune]` range pinned in pyproject.toml; tests/test_private_internals.py
fails loudly when a release changes them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from lm_tuner.tuner.run.reporting import FAILED, INFRASTRUCTURE, OBJECTIVE, TURN
from lm_tuner.tuner.store.ledger import TrialLedger

NewTrialHook = Callable[[int, int, dict[str, Any]], dict[str, Any]]
"""Called as (optuna_trial_id, number, params) when a trial is proposed; returns more config for it."""


class StoreFaults:
    """Shared by the searchers of one run: once the artifact store has failed a trial (full, read-only), none of
    them proposes another, which would train up to its first checkpoint and fail the same way. Trials already
    running end as they will."""

    def __init__(self) -> None:
        self.seen = False


class StudySearcher(OptunaSearch):
    def __init__(
        self,
        *,
        family: str,
        space: dict[str, optuna.distributions.BaseDistribution],
        sampler: optuna.samplers.BaseSampler,
        study_name: str,
        storage: optuna.storages.BaseStorage,
        on_new_trial: NewTrialHook,
        ledger: TrialLedger,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        store_faults: StoreFaults | None = None,
    ) -> None:
        super().__init__(space=space, metric=OBJECTIVE, mode="min", sampler=sampler, study_name=study_name,
                         storage=storage)
        for point in points_to_evaluate or []:  # Optuna samples what a point leaves out, where Ray refuses the point
            self._ot_study.enqueue_trial(point)
        self._family = family
        self._on_new_trial = on_new_trial
        self._ledger = ledger
        self._reported_turns: dict[str, int] = {}
        self._optuna_study_id = storage.get_study_id_from_name(study_name)
        self._store_faults = store_faults or StoreFaults()

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._store_faults.seen:
            return Searcher.FINISHED
        params = super().suggest(trial_id)
        ot_trial = self._ot_trials[trial_id]
        number, optuna_trial_id = ot_trial.number, self._optuna_trial_id(ot_trial)
        extra = self._on_new_trial(optuna_trial_id, number, params)
        return {"params": params, "family": self._family, "number": number, "optuna_trial_id": optuna_trial_id,
                **extra}

    def _optuna_trial_id(self, ot_trial: optuna.Trial) -> int:
        return self._storage.get_trial_id_from_study_id_trial_number(self._optuna_study_id, ot_trial.number)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if FAILED in result or trial_id in self._completed_trials or \
                result[TURN] <= self._reported_turns.get(trial_id, 0):
            return  # a failure report, not a turn; a late result of a finished trial; a resumed trial's turn told again
        # Optuna's step is our turn, not Ray's iteration count, which restarts when a trial resumes.
        self._ot_trials[trial_id].report(result[OBJECTIVE], result[TURN])
        self._reported_turns[trial_id] = result[TURN]

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id in self._completed_trials:
            return
        ot_trial = self._ot_trials[trial_id]
        value = result.get(OBJECTIVE) if result else None
        if value is not None and result.get(TURN, 0) > self._reported_turns.get(trial_id, 0):
            # A scheduler that stops a trial hands its last result only to this method.
            ot_trial.report(value, result[TURN])
        optuna_trial_id = self._optuna_trial_id(ot_trial)
        if error or (result and FAILED in result):
            self._store_faults.seen = self._store_faults.seen or bool(result and result.get(INFRASTRUCTURE))
            self._ot_study.tell(ot_trial, state=TrialState.FAIL)
            self._ledger.ended(optuna_trial_id, TrialState.FAIL, reason=result.get(FAILED) if result else None,
                               interrupted=bool(result and result.get(INFRASTRUCTURE)))
        elif result and result.get("finished") and value is not None:
            self._ot_study.tell(ot_trial, value, state=TrialState.COMPLETE)
            self._ledger.ended(optuna_trial_id, TrialState.COMPLETE, value)
        elif self._ledger.cancel_requested():
            self._ot_study.tell(ot_trial, state=TrialState.FAIL)
            self._ledger.cancelled(optuna_trial_id)
        else:
            if value is not None:
                ot_trial.set_user_attr("last_value", value)
            self._ot_study.tell(ot_trial, state=TrialState.PRUNED)
            self._ledger.ended(optuna_trial_id, TrialState.PRUNED)
        self._completed_trials.add(trial_id)
