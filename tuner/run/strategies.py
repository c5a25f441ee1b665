"""How trials are proposed (Optuna samplers) and stopped early (Ray Tune schedulers)."""

from __future__ import annotations

import optuna
from ray.tune.schedulers import ASHAScheduler, MedianStoppingRule, TrialScheduler

from lm_tuner.tuner.spec import StudySpec

UNBOUNDED_TURNS = 10**6
"""ASHA needs a cap on turns; under an epoch or time budget the budget ends a trial long before."""


def make_sampler(name: str, seed: int, startup_trials: int) -> optuna.samplers.BaseSampler:
    """An Optuna sampler by its spec name: gp, tpe, qmc or random."""
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, scramble=True)
    return optuna.samplers.RandomSampler(seed=seed)


def make_scheduler(spec: StudySpec, metric: str, time_attr: str) -> TrialScheduler | None:
    """Ray Tune's early-stopping scheduler for the spec, measuring time in turns (`time_attr`)."""
    rule = spec.early_stopping
    if rule.method == "asha":
        return ASHAScheduler(time_attr=time_attr, metric=metric, mode="min",
                             max_t=spec.planned_turns() or UNBOUNDED_TURNS, grace_period=rule.grace_turns,
                             reduction_factor=rule.reduction_factor)
    if rule.method == "median":
        return MedianStoppingRule(time_attr=time_attr, metric=metric, mode="min", grace_period=rule.grace_turns,
                                  min_samples_required=rule.min_samples)
    return None

