"""Ray Tune runs over Optuna studies: how tuning (all families in one run), reruns and stage 2 execute."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from ray import tune
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher

from lm_tuner.tuner.run.cancellation import CancellationStopper
from lm_tuner.tuner.run.interleaving import FamilyScheduler, FamilyShare, InterleavedSearcher
from lm_tuner.tuner.run.recorder import StudyRecorder
from lm_tuner.tuner.run.search import NewTrialHook, StoreFaults, StudySearcher
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.engine import optuna_storage
from lm_tuner.tuner.store.ledger import TrialLedger

SHARED_FIELDS = ("study", "trainable", "job", "resources", "concurrency", "max_retries")
"""What experiments run together must agree on: one trainable, one job, one pool of slots."""


@dataclass
class Experiment:
    """What to run: `trials` more trials of the Optuna study `optuna_name`, each a call of `trainable`.

    `settled` is how many trials of the study already count (a resumed study): run with other families,
    the family that is behind gets the next trials.
    """

    study: str
    family: str
    optuna_name: str
    trials: int
    space: dict[str, BaseDistribution]
    sampler: optuna.samplers.BaseSampler
    trainable: Callable[[dict[str, Any], dict[str, Any]], None]
    job: dict[str, Any]
    registrar: NewTrialHook
    resources: dict[str, float]
    concurrency: int
    max_retries: int
    scheduler: TrialScheduler | None = None
    points: list[dict[str, Any]] = field(default_factory=list)
    settled: int = 0
    make_searcher: Callable[[TrialLedger, StoreFaults], Searcher] | None = None
    """The family's searcher, where it is not the one-trial-per-configuration StudySearcher (successive halving)."""


def run_experiment(experiment: Experiment, settings: Settings, callbacks: Sequence[tune.Callback] = ()) -> None:
    run_experiments([experiment], settings, callbacks)


def run_experiments(experiments: Sequence[Experiment], settings: Settings,
                    callbacks: Sequence[tune.Callback] = ()) -> None:
    """One Ray Tune run over the experiments, one per family: their trials share the concurrency slots and are
    proposed in turn (tuner.run.interleaving), each family stopped early by a scheduler of its own."""
    _check_shared(experiments)
    first, url = experiments[0], settings.storage_url
    ledger = TrialLedger(url, first.study)
    store_faults = StoreFaults()
    searcher = InterleavedSearcher([FamilyShare(e.family, e.make_searcher(ledger, store_faults) if e.make_searcher
                                                else _searcher(e, ledger, url, store_faults), e.trials, e.settled)
                                    for e in experiments])
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(first.trainable, job=first.job), first.resources),
        tune_config=tune.TuneConfig(search_alg=searcher,
                                    scheduler=FamilyScheduler({e.family: e.scheduler for e in experiments}),
                                    num_samples=sum(e.trials for e in experiments),
                                    max_concurrent_trials=first.concurrency,
                                    # a new trial reuses a finished trial's process: no second start-up
                                    # (imports, corpus) per trial
                                    reuse_actors=True),
        run_config=tune.RunConfig(
            name=f"{_run_name(experiments).replace('/', '-')}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=str(settings.ray_results),
            stop=CancellationStopper(ledger),
            failure_config=tune.FailureConfig(max_failures=first.max_retries),
            verbose=0,
            callbacks=[StudyRecorder(url), *callbacks],
        ),
    )
    tuner.fit()


def _searcher(experiment: Experiment, ledger: TrialLedger, url: str, store_faults: StoreFaults) -> StudySearcher:
    return StudySearcher(
        family=experiment.family,
        space=experiment.space,
        sampler=experiment.sampler,
        study_name=experiment.optuna_name,
        storage=optuna_storage(url),
        on_new_trial=experiment.registrar,
        ledger=ledger,
        points_to_evaluate=experiment.points,
        store_faults=store_faults,
    )


def _check_shared(experiments: Sequence[Experiment]) -> None:
    if not experiments:
        raise ValueError("experiments: at least one is needed")
    for name in SHARED_FIELDS:
        differing = [e.family for e in experiments if getattr(e, name) != getattr(experiments[0], name)]
        if differing:
            raise ValueError(f"{name}: experiments run together must share it; that of {', '.join(differing)} "
                             f"differs from {experiments[0].family}'s")


def _run_name(experiments: Sequence[Experiment]) -> str:
    if len(experiments) == 1:
        return experiments[0].optuna_name
    return f"{experiments[0].study}/{'+'.join(e.family for e in experiments)}"
