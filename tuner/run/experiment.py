"""One Ray Tune run over one Optuna study: how tuning, reruns and stage-2 studies all execute."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from ray import tune
from ray.tune.schedulers import TrialScheduler

from lm_tuner.tuner.run.cancellation import CancellationStopper
from lm_tuner.tuner.run.recorder import StudyRecorder
from lm_tuner.tuner.run.search import NewTrialHook, StudySearcher
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.engine import optuna_storage
from lm_tuner.tuner.store.ledger import TrialLedger


@dataclass
class Experiment:
    """What to run: `trials` more trials of the Optuna study `optuna_name`, each a call of `trainable`."""

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


def run_experiment(experiment: Experiment, settings: Settings, callbacks: Sequence[tune.Callback] = ()) -> None:
    url = settings.storage_url
    ledger = TrialLedger(url, experiment.study)
    searcher = StudySearcher(
        family=experiment.family,
        space=experiment.space,
        sampler=experiment.sampler,
        study_name=experiment.optuna_name,
        storage=optuna_storage(url),
        on_new_trial=experiment.registrar,
        ledger=ledger,
        points_to_evaluate=experiment.points,
    )
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(experiment.trainable, job=experiment.job), experiment.resources),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=experiment.scheduler, num_samples=experiment.trials,
                                    max_concurrent_trials=experiment.concurrency,
                                    # a new trial reuses a finished trial's process: no second start-up
                                    # (imports, corpus) per trial
                                    reuse_actors=True),
        run_config=tune.RunConfig(
            name=f"{experiment.optuna_name.replace('/', '-')}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=str(settings.ray_results),
            stop=CancellationStopper(ledger),
            failure_config=tune.FailureConfig(max_failures=experiment.max_retries),
            verbose=0,
            callbacks=[StudyRecorder(url), *callbacks],
        ),
    )
    tuner.fit()
