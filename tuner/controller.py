"""The controller: turns a validated spec into Optuna studies whose trials Ray Tune runs.

One Optuna study per model family, each with the same budget, data, schedule and trial count, so
families are compared on equal terms. The database is the source of truth: launching a study that
already exists with the same spec continues it where it stopped.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from optuna.trial import TrialState
from ray import tune
from sqlalchemy import select

from models import count_parameters
from trainers import load_corpus
from tuner.cancellation import CancellationStopper
from tuner.db import StudyRecord, TrialRecord, ensure_schema, families_column, optuna_storage, sessions, utcnow
from tuner.ledger import TrialLedger, record_interrupted
from tuner.lifecycle import CANCELLED_REASON, cancel_requested
from tuner.recorder import StudyRecorder
from tuner.reporting import OBJECTIVE, TURN
from tuner.search import StudySearcher
from tuner.settings import Settings
from tuner.space import distributions, initial_points, optuna_study_name, trial_seed, trial_setup
from tuner.spec import StudySpec
from tuner.strategies import make_sampler, make_scheduler
from tuner.trial import run_trial

# Ray's newer console output prints experiment banners even at verbose=0; the classic one is silent.
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
# Ctrl-C (or a worker's stop) must reach the controller as KeyboardInterrupt, so that running trials are
# marked interrupted and the study can be continued; Tune's own handler would swallow it and stay installed.
os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")

FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
INTERRUPTED_REASON = "its controller stopped before the trial finished"


class StudyConflict(RuntimeError):
    """The study name is taken by a different spec, or another live process is running it."""


def this_controller() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def launch_study(
    spec: StudySpec,
    document: str,
    settings: Settings,
    *,
    submitted_via: str = "cli",
    callbacks: Sequence[tune.Callback] = (),
) -> str:
    """Create (or continue) the study and run it to the end; returns its final status."""
    ensure_schema(settings.storage_url)
    claim_study(settings.storage_url, spec, document, submitted_via)
    return run_claimed_study(spec, settings, callbacks=callbacks)


def claim_study(url: str, spec: StudySpec, document: str, submitted_via: str) -> None:
    """Record this process as the study's controller, creating the study if it is new."""
    spec_data = spec.model_dump(mode="json")
    with sessions(url).begin() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == spec.name).with_for_update())
        if record is None:
            record = StudyRecord(name=spec.name, spec=spec_data, families=families_column(spec.families),
                                 document=document, submitted_via=submitted_via)
            session.add(record)
        elif record.spec != spec_data:
            raise StudyConflict(
                f"name: a study named {spec.name!r} already exists with a different spec; "
                f"give this one a new name (a relaunch continues a study only when the spec is identical)"
            )
        elif record.status in ("running", "cancelling") and record.controller and \
                controller_alive(record.controller):
            raise StudyConflict(f"study {spec.name!r} is being run by process {record.controller}")
        record.status = "running"
        record.controller = this_controller()
        record.started_at = record.started_at or utcnow()
        record.error = None


def run_claimed_study(spec: StudySpec, settings: Settings, *, callbacks: Sequence[tune.Callback] = ()) -> str:
    url = settings.storage_url
    try:
        corpus = load_corpus(spec.dataset)
        vocab_size = len(corpus.vocabulary)
        for family in spec.families:  # fail before any trial runs when the budget cannot fit a model
            trial_setup(spec, family, {}, vocab_size, 0)
        with sessions(url).begin() as session:
            record = session.scalar(select(StudyRecord).where(StudyRecord.name == spec.name))
            record.best_possible_loss = corpus.best_cross_entropy
        _fail_interrupted_trials(url, spec)
        for family in spec.families:
            remaining = spec.tuning.trials - _counted_trials(url, spec, family)
            if remaining > 0 and not cancel_requested(url, spec.name):
                _connect_ray(settings)
                _tune_family(spec, family, remaining, vocab_size, settings, callbacks)
        if cancel_requested(url, spec.name):
            _fail_interrupted_trials(url, spec, CANCELLED_REASON)  # those stopped before their first report
            _finish(url, spec.name, "cancelled", CANCELLED_REASON)
            return "cancelled"
        missing = sum(max(0, spec.tuning.trials - _counted_trials(url, spec, f)) for f in spec.families)
    except BaseException as error:
        _fail_interrupted_trials(url, spec)
        _finish(url, spec.name, "failed", f"{type(error).__name__}: {error}")
        raise
    if missing:
        _finish(url, spec.name, "failed", f"stopped with {missing} trial(s) not run; launch the same spec again "
                                          f"to continue")
        return "failed"
    _finish(url, spec.name, "complete", None)
    return "complete"


def _tune_family(spec: StudySpec, family: str, trials: int, vocab_size: int, settings: Settings,
                 callbacks: Sequence[tune.Callback]) -> None:
    url = settings.storage_url
    storage = optuna_storage(url)

    study_name = optuna_study_name(spec.name, family)
    searcher = StudySearcher(
        family=family,
        space=distributions(spec, family),
        sampler=make_sampler(spec.tuning),
        study_name=study_name,
        storage=storage,
        on_new_trial=TrialRegistrar(spec, family, vocab_size, url),
        ledger=TrialLedger(url, spec.name),
        points_to_evaluate=[] if _has_trials(storage, study_name) else initial_points(spec, family),
    )
    job = {"spec": spec.model_dump(mode="json"), "artifact_root": str(settings.artifact_root)}
    resources = {"cpu": spec.resources.cpus_per_trial, "gpu": spec.resources.gpus_per_trial}
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(run_trial, job=job), resources),
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=make_scheduler(spec, OBJECTIVE, TURN),
                                    num_samples=trials, max_concurrent_trials=spec.tuning.concurrency,
                                    # a new trial reuses a finished trial's process: no second start-up
                                    # (imports, corpus) per trial
                                    reuse_actors=True),
        run_config=tune.RunConfig(
            name=f"{spec.name}-{family}-{time.strftime('%Y%m%d-%H%M%S')}",
            storage_path=str(settings.ray_results),
            stop=CancellationStopper(TrialLedger(url, spec.name)),
            failure_config=tune.FailureConfig(max_failures=spec.tuning.max_retries),
            verbose=0,
            callbacks=[StudyRecorder(url), *callbacks],
        ),
    )
    tuner.fit()


@dataclass(frozen=True)
class TrialRegistrar:
    """Records a proposed trial's family, size and seed (a picklable object: Ray saves searchers)."""

    spec: StudySpec
    family: str
    vocab_size: int
    url: str

    def __call__(self, optuna_trial_id: int, number: int, params: dict[str, Any]) -> None:
        attributes: dict[str, Any] = {"family": self.family, "seed": trial_seed(self.spec, number)}
        fail_reason = None
        try:
            setup = trial_setup(self.spec, self.family, params, self.vocab_size, number)
            attributes |= {"hidden_size": setup.model.hidden_size, "parameter_count": count_parameters(setup.model)}
        except ValueError as error:  # the trial itself will fail with the same error; record it now
            fail_reason = str(error)
        storage = optuna_storage(self.url)
        for key, value in attributes.items():  # visible to optuna-dashboard too
            storage.set_trial_user_attr(optuna_trial_id, key, value)
        with sessions(self.url).begin() as session:
            session.merge(TrialRecord(trial_id=optuna_trial_id, study_name=self.spec.name, number=number,
                                      fail_reason=fail_reason, **attributes))


def _has_trials(storage, study_name: str) -> bool:
    try:
        return bool(storage.get_all_trials(storage.get_study_id_from_name(study_name), deepcopy=False))
    except KeyError:
        return False


def _counted_trials(url: str, spec: StudySpec, family: str) -> int:
    """Finished trials that count towards the family's trial budget (interrupted ones do not)."""
    storage = optuna_storage(url)
    try:
        study_id = storage.get_study_id_from_name(optuna_study_name(spec.name, family))
    except KeyError:
        return 0
    finished = {t._trial_id for t in storage.get_all_trials(study_id, deepcopy=False, states=FINISHED_STATES)}
    with sessions(url)() as session:
        interrupted = set(session.scalars(select(TrialRecord.trial_id).where(
            TrialRecord.study_name == spec.name, TrialRecord.family == family, TrialRecord.interrupted)))
    return len(finished - interrupted)


def _fail_interrupted_trials(url: str, spec: StudySpec, reason: str = INTERRUPTED_REASON) -> None:
    """Trials left RUNNING by a controller that stopped are failed explicitly, never left as zombies.

    They are marked interrupted, so they do not count against the trial budget and are run again."""
    storage = optuna_storage(url)
    for family in spec.families:
        try:
            study_id = storage.get_study_id_from_name(optuna_study_name(spec.name, family))
        except KeyError:
            continue
        for trial in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            record_interrupted(url, spec.name, family, trial._trial_id, trial.number, trial_seed(spec, trial.number),
                               reason)


def _finish(url: str, name: str, status: str, error: str | None) -> None:
    with sessions(url).begin() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
        record.status, record.error, record.finished_at, record.controller = status, error, utcnow(), None


def _connect_ray(settings: Settings) -> None:
    if ray.is_initialized():
        return
    ray.init(address=settings.ray_address, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)


def controller_alive(controller: str) -> bool:
    host, _, pid = controller.rpartition(":")
    if host != socket.gethostname():
        return True  # cannot check another machine: assume it is alive
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True
