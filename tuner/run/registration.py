"""What is recorded about a trial when it is proposed: its stage, lineage, seed and model size.

Registrars are plain picklable objects (Ray saves searchers); each returns the extra configuration
its trial needs (the seed it trains with).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lm_tuner.models import count_parameters
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.space import trial_seed, trial_setup
from lm_tuner.tuner.store.engine import optuna_storage, sessions
from lm_tuner.tuner.store.schema import TrialRecord

PARENT = "parent_trial_id"
SEED = "seed"


@dataclass(frozen=True)
class TrialRegistrar:
    """Registers training trials: tuning trials (seed + number) and reruns (parent and seed enqueued)."""

    spec: StudySpec
    family: str
    vocab_size: int
    url: str
    stage: str = "tune"
    budget_steps: int | None = None  # the top rung's steps, where a compute budget decides how far trials train

    def __call__(self, optuna_trial_id: int, number: int, params: dict[str, Any]) -> dict[str, Any]:
        storage = optuna_storage(self.url)
        enqueued = storage.get_trial(optuna_trial_id).user_attrs
        seed = enqueued.get(SEED, trial_seed(self.spec, number))
        attributes: dict[str, Any] = {"family": self.family, "seed": seed}
        fail_reason = None
        try:
            setup = trial_setup(self.spec, self.family, params, self.vocab_size, seed)
            attributes |= {"hidden_size": setup.model.hidden_size, "parameter_count": count_parameters(setup.model)}
        except ValueError as error:  # the trial itself will fail with the same error; record it now
            fail_reason = str(error)
        for key, value in attributes.items():  # visible to optuna-dashboard too
            storage.set_trial_user_attr(optuna_trial_id, key, value)
        with sessions(self.url).begin() as session:
            session.merge(TrialRecord(trial_id=optuna_trial_id, study_name=self.spec.name, number=number,
                                      stage=self.stage, parent_trial_id=enqueued.get(PARENT),
                                      fail_reason=fail_reason, **attributes))
        extra: dict[str, Any] = {"seed": seed, "stage": self.stage}
        if self.budget_steps is not None:
            extra["budget_steps"] = self.budget_steps
        return extra


@dataclass(frozen=True)
class DynamicEvaluationRegistrar:
    """Registers stage-2 trials: each adapts the checkpoint of `parent_trial_id` with sampled settings."""

    study: str
    family: str
    parent_trial_id: int
    url: str

    def __call__(self, optuna_trial_id: int, number: int, params: dict[str, Any]) -> dict[str, Any]:
        with sessions(self.url).begin() as session:
            parent = session.get(TrialRecord, self.parent_trial_id)
            session.merge(TrialRecord(trial_id=optuna_trial_id, study_name=self.study, family=self.family,
                                      number=number, stage="dyneval", parent_trial_id=self.parent_trial_id,
                                      seed=parent.seed, hidden_size=parent.hidden_size,
                                      parameter_count=parent.parameter_count))
        optuna_storage(self.url).set_trial_user_attr(optuna_trial_id, PARENT, self.parent_trial_id)
        return {}
