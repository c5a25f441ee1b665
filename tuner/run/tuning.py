"""The tuning stage: every family's remaining trials in one Ray Tune run, the CPU kernels ready beforehand."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from ray import tune

from lm_tuner.models import cpu_kernels
from lm_tuner.tuner.run.budgeting import stored_budget_plan
from lm_tuner.tuner.run.experiment import Experiment, run_experiments
from lm_tuner.tuner.run.halving import HalvingSearcher
from lm_tuner.tuner.run.registration import TrialRegistrar
from lm_tuner.tuner.run.reporting import OBJECTIVE, TURN
from lm_tuner.tuner.run.rung_sampler import RungSampler
from lm_tuner.tuner.run.search import StoreFaults
from lm_tuner.tuner.run.strategies import make_sampler, make_scheduler
from lm_tuner.tuner.run.trial import run_trial, training_job
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.space import distributions, initial_points
from lm_tuner.tuner.store.engine import optuna_storage
from lm_tuner.tuner.store.ledger import TrialLedger, settled_trials
from lm_tuner.tuner.store.optuna_names import optuna_study_name

logger = logging.getLogger(__name__)


def tune_families(spec: StudySpec, vocab_size: int, settings: Settings, callbacks: Sequence[tune.Callback]) -> None:
    """Run the trials each family still lacks, the families interleaved (tuner.run.interleaving); under a compute
    budget, by successive halving on the rungs of the study's plan (tuner.run.halving)."""
    build = tuning_experiment if spec.compute_budget is None else halving_experiment
    experiments = [experiment for family in spec.families
                   if (experiment := build(spec, family, vocab_size, settings)).trials > 0]
    if not experiments:
        return
    if spec.resources.gpus_per_trial == 0:
        prepare_cpu_kernels()
    run_experiments(experiments, settings, callbacks)


def tuning_experiment(spec: StudySpec, family: str, vocab_size: int, settings: Settings) -> Experiment:
    """The family's tuning trials still to run (none left: `trials` is 0), counting those already settled."""
    url = settings.storage_url
    optuna_name = optuna_study_name(spec.name, family)
    settled = settled_trials(url, optuna_name)
    return Experiment(
        study=spec.name, family=family, optuna_name=optuna_name, trials=max(0, spec.tuning.trials - settled),
        settled=settled, space=distributions(spec, family),
        sampler=make_sampler(spec.tuning.sampler, spec.tuning.seed, spec.tuning.startup_trials),
        trainable=run_trial,
        job=training_job(spec, str(settings.artifact_root)),
        registrar=TrialRegistrar(spec, family, vocab_size, url),
        resources={"cpu": spec.resources.cpus_per_trial, "gpu": spec.resources.gpus_per_trial},
        concurrency=spec.tuning.concurrency, max_retries=spec.tuning.max_retries,
        scheduler=make_scheduler(spec, OBJECTIVE, TURN),
        points=[] if _has_trials(optuna_storage(url), optuna_name) else initial_points(spec, family),
    )


def halving_experiment(spec: StudySpec, family: str, vocab_size: int, settings: Settings) -> Experiment:
    """The family's bracket on the rungs of the study's stored plan: `trials` bounds the segments (Ray Tune trials)
    still to run, 0 when every configuration is settled."""
    url = settings.storage_url
    plan = stored_budget_plan(url, spec.name)
    if plan is None:
        raise RuntimeError(f"study {spec.name!r} has a compute budget but no stored plan; its controller fixes one "
                           f"before tuning")
    budget, rungs = spec.compute_budget, plan.family(family)
    optuna_name = optuna_study_name(spec.name, family)
    settled = settled_trials(url, optuna_name)
    space = distributions(spec, family)
    startup = spec.tuning.startup_trials if "startup_trials" in spec.tuning.model_fields_set else \
        max(2, math.ceil(budget.configurations / 3))  # a third of the lowest rung explores, as in BOHB
    sampler = RungSampler(make_sampler(spec.tuning.sampler, spec.tuning.seed, startup),
                          [rung.steps // spec.training.steps_per_turn for rung in rungs.rungs], enough=len(space) + 1)
    registrar = TrialRegistrar(spec, family, vocab_size, url)
    points = initial_points(spec, family)

    def searcher(ledger: TrialLedger, store_faults: StoreFaults) -> HalvingSearcher:
        return HalvingSearcher(family=family, budget=rungs, steps_per_turn=spec.training.steps_per_turn, space=space,
                               sampler=sampler, study_name=optuna_name, url=url, registrar=registrar, ledger=ledger,
                               points=points, store_faults=store_faults)

    segments = sum(rung.configurations for rung in rungs.rungs) + budget.configurations  # at most, resumed ones too
    return Experiment(
        study=spec.name, family=family, optuna_name=optuna_name,
        trials=segments if settled < budget.configurations else 0, settled=settled, space=space, sampler=sampler,
        trainable=run_trial, job=training_job(spec, str(settings.artifact_root)), registrar=registrar,
        resources={"cpu": spec.resources.cpus_per_trial, "gpu": spec.resources.gpus_per_trial},
        concurrency=spec.tuning.concurrency, max_retries=spec.tuning.max_retries, make_searcher=searcher)


def prepare_cpu_kernels() -> None:
    """Build (or load) the C++ kernels now, so that no trial's wall-clock budget pays for the build (about
    20 s, which would fall on the first trials of whichever family started first). Where they cannot be built,
    cpu_kernels warns once and trials take the PyTorch operations."""
    started = time.monotonic()
    if cpu_kernels.cpu_extension() is not None:
        logger.info("C++ kernels for CPUs ready in %.1f s", time.monotonic() - started)


def _has_trials(storage, study_name: str) -> bool:
    try:
        return bool(storage.get_all_trials(storage.get_study_id_from_name(study_name), deepcopy=False))
    except KeyError:
        return False
