"""Measured sensitivity: the best configuration trained again with one hyperparameter moved across ±15% of
its searched range, several seeds per value — the effect measured, not read off a surrogate's slice plot.

The runs are queued as WAITING trials of the Optuna study `name/family/sensitivity` (one per family, so
checkpoints never collide), tagged with the moved hyperparameter; whoever runs them — `tuner sensitivity`
at once, or a `tuner worker` for a request made over REST — trains them through the same Ray Tune path
as reruns. Asking twice queues nothing new. What the runs found is read by `tuner.analysis.sensitivity`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import TrialState
from ray import tune
from sqlalchemy import select

from lm_tuner.trainers import load_corpus
from lm_tuner.tuner.run.budgeting import top_rung_steps
from lm_tuner.tuner.run.experiment import Experiment, run_experiment
from lm_tuner.tuner.run.registration import PARENT, SEED, TrialRegistrar
from lm_tuner.tuner.run.trial import run_trial, training_job
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.space import distributions, rerun_seed
from lm_tuner.tuner.store.engine import optuna_storage, sessions
from lm_tuner.tuner.store.optuna_internals import storage_trial_id
from lm_tuner.tuner.store.optuna_names import optuna_study_name
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord
from lm_tuner.tuner.store.trials import top_trials

SPAN = 0.15  # of the searched range, either side of the best value
MOVED, MOVED_TO = "sensitivity_parameter", "sensitivity_value"  # user attributes of each run
STAGE = "sensitivity"
SEEDS = range(1, 21)  # training seeds per moved value a request may ask for
POINTS = range(2, 22)  # moved values a request may ask for: at most 21 x 20 = 420 runs

class SensitivityError(ValueError):
    """A request that cannot be served; the message names the field, the value and what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class SensitivityPlan:
    study: str
    family: str
    parameter: str
    best_trial_id: int
    best_value: float
    values: list[float]
    seeds: list[int]
    queued: int  # trials newly queued by this request


def moved_values(distribution: BaseDistribution, best: float, points: int) -> list[float]:
    """`points` values evenly across best ± SPAN of the range (on the log scale for log ranges), clipped to
    the range; integers rounded and duplicates dropped. An odd count includes the best value itself."""
    if isinstance(distribution, CategoricalDistribution):
        raise SensitivityError("parameter", "a categorical hyperparameter has no range to move across; "
                                            "choose a numeric one")
    low, high = distribution.low, distribution.high
    scale = (math.log, math.exp) if distribution.log else (float, float)
    centre, width = scale[0](best), SPAN * (scale[0](high) - scale[0](low))
    values = [min(high, max(low, scale[1](centre + offset))) for offset in np.linspace(-width, width, points)]
    if isinstance(distribution, IntDistribution):
        values = [int(round(v)) for v in values]
    return sorted(dict.fromkeys(values))


def plan_sensitivity(url: str, name: str, parameter: str, *, seeds: int, points: int,
                     family: str | None = None) -> SensitivityPlan:
    """Queue the runs (those not already queued or run) and say what they are."""
    with sessions(url)() as session:
        spec_data = session.scalar(select(StudyRecord.spec).where(StudyRecord.name == name))
    if spec_data is None:
        raise KeyError(name)
    spec = StudySpec.model_validate(spec_data)
    for field, count, allowed in (("seeds", seeds, SEEDS), ("points", points, POINTS)):
        if count not in allowed:
            raise SensitivityError(field, f"got {count}; allowed: {allowed.start} to {allowed.stop - 1}")
    family = family or _best_family(url, spec)
    if family not in spec.families:
        raise SensitivityError("family", f"got {family!r}; allowed: {', '.join(spec.families)}")
    space = distributions(spec, family)
    if parameter not in space or space[parameter].single():
        searched = ", ".join(p for p, d in space.items() if not d.single()) or "none"
        raise SensitivityError("parameter", f"got {parameter!r}; allowed: a hyperparameter searched for {family} "
                                            f"({searched})")
    best = top_trials(url, name, family, "tune", 1)
    if not best:
        raise SensitivityError("family", f"{family} has no complete tuning trial yet; wait for one")
    storage = optuna_storage(url)
    best_params = storage.get_trial(best[0].trial_id).params
    values = moved_values(space[parameter], best_params[parameter], points)
    seed_list = [rerun_seed(spec, repeat) for repeat in range(seeds)]
    study = optuna.create_study(study_name=optuna_study_name(name, family, STAGE), storage=storage,
                                direction="minimize", load_if_exists=True)
    taken = {(t.user_attrs.get(MOVED_TO), t.user_attrs.get(SEED))
             for t in study.get_trials(deepcopy=False) if t.user_attrs.get(MOVED) == parameter
             and not _interrupted(url, t)}
    queued = 0
    for value in values:
        for seed in seed_list:
            if (value, seed) not in taken:
                study.enqueue_trial({**best_params, parameter: value},
                                    user_attrs={PARENT: best[0].trial_id, SEED: seed, MOVED: parameter,
                                                MOVED_TO: value})
                queued += 1
    return SensitivityPlan(name, family, parameter, best[0].trial_id, best_params[parameter], values, seed_list, queued)


def run_queued_sensitivity(spec: StudySpec, settings: Settings, callbacks: Sequence[tune.Callback] = ()) -> int:
    """Train every queued sensitivity run of the study; returns how many ran."""
    url = settings.storage_url
    storage = optuna_storage(url)
    ran = 0
    vocab_size = None
    for family in spec.families:
        optuna_name = optuna_study_name(spec.name, family, STAGE)
        pending = queued_count(storage, optuna_name)
        if not pending:
            continue
        vocab_size = vocab_size or len(load_corpus(spec.dataset).vocabulary)
        run_experiment(Experiment(
            study=spec.name, family=family, optuna_name=optuna_name, trials=pending,
            space=distributions(spec, family), sampler=optuna.samplers.RandomSampler(seed=spec.tuning.seed),
            trainable=run_trial,
            job=training_job(spec, str(settings.artifact_root)),
            registrar=TrialRegistrar(spec, family, vocab_size, url, stage=STAGE,
                                     budget_steps=top_rung_steps(spec, url, family)),
            resources={"cpu": spec.resources.cpus_per_trial, "gpu": spec.resources.gpus_per_trial},
            concurrency=spec.tuning.concurrency, max_retries=spec.tuning.max_retries,
        ), settings, callbacks)
        ran += pending
    return ran


def studies_with_queued_sensitivity(url: str) -> list[str]:
    """Names of studies with sensitivity runs waiting to be trained."""
    storage = optuna_storage(url)
    names = []
    for study in storage.get_all_studies():
        parts = study.study_name.split("/")
        if len(parts) == 3 and parts[2] == STAGE and queued_count(storage, study.study_name):
            names.append(parts[0])
    return sorted(set(names))


def _best_family(url: str, spec: StudySpec) -> str:
    best = [(t[0].value, family) for family in spec.families if (t := top_trials(url, spec.name, family, "tune", 1))]
    return min(best)[1] if best else spec.families[0]


def queued_count(storage: optuna.storages.BaseStorage, optuna_name: str) -> int:
    """Trials of the Optuna study `optuna_name` waiting to be trained (0 if there is no such study)."""
    try:
        study_id = storage.get_study_id_from_name(optuna_name)
    except KeyError:
        return 0
    return len(storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)))


def _interrupted(url: str, trial: optuna.trial.FrozenTrial) -> bool:
    with sessions(url)() as session:
        record = session.get(TrialRecord, storage_trial_id(trial))
    return record is not None and record.interrupted
