"""The controller: turns a validated spec into Optuna studies whose trials Ray Tune runs.

One Optuna study per model family, each with the same budget, data, schedule and trial count, so
families are compared on equal terms; their trials take turns in one Ray Tune run (tuner.run.tuning), so a
study stopped at any point has given every family about as many trials. The database is the source of
truth: launching a study that already exists with the same spec continues it where it stopped.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import ray
from optuna.trial import TrialState
from ray import tune
from sqlalchemy import exists, select

from lm_tuner.trainers import Corpus, artifact_store, load_corpus, unigram_perplexity
from lm_tuner.trainers.datasets import unreadable_data
from lm_tuner.tuner.run.budgeting import fixed_budget_plan, measured_budget_plan, stored_budget_plan
from lm_tuner.tuner.run.machine import this_machine
from lm_tuner.tuner.run.processes import signal_handlers_kept
from lm_tuner.tuner.run.ray_quiet import quiet_ray
from lm_tuner.tuner.run.stages import run_full_validations, run_reruns, run_stage_two, run_test_protocols
from lm_tuner.tuner.run.tuning import tune_families
from lm_tuner.tuner.settings import ArtifactRoot, Settings, masked_url
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.budget_plan import BudgetTooSmall
from lm_tuner.tuner.spec.estimate import parallel_trials
from lm_tuner.tuner.spec.feasibility import budget_issues, task_issues
from lm_tuner.tuner.spec.plan import BudgetPlan
from lm_tuner.tuner.spec.space import trial_seed
from lm_tuner.tuner.store import claims
from lm_tuner.tuner.store.engine import ensure_schema, optuna_storage, sessions
from lm_tuner.tuner.store.ledger import (
    complete_tuning_trials,
    last_trial_id,
    record_interrupted,
    settled_trials,
    store_faults,
)
from lm_tuner.tuner.store.lifecycle import CANCELLED_REASON, cancel_requested, release_unstarted_name
from lm_tuner.tuner.store.optuna_internals import storage_trial_id
from lm_tuner.tuner.store.optuna_names import optuna_studies_of, optuna_study_name
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord, families_column, utcnow

# Ctrl-C (or a worker's stop) must reach the controller as KeyboardInterrupt, so that running trials are
# marked interrupted and the study can be continued; Tune's own handler would swallow it and stay installed.
os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")

INTERRUPTED_REASON = "its controller stopped before the trial finished"

CLAIM_ATTEMPTS = 3  # a claim that lost a race reads the study again: by then another process runs it


class StudyConflict(RuntimeError):
    """The study name is taken by a different spec, or another live process is running it, or the artifact store
    holds files of an earlier study of that name."""


class StudyRefused(ValueError):
    """The study cannot run as specified: its data cannot be read, or its budget fits no model."""


def this_controller() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def launch_study(
    spec: StudySpec,
    document: str,
    settings: Settings,
    *,
    submitted_via: str = "cli",
    callbacks: Sequence[tune.Callback] = (),
    while_ray_starts: Callable[[], None] | None = None,
) -> str:
    """Create (or continue) the study and run it to the end; returns its final status. Its data and budget are
    checked first: a study that cannot run is refused (StudyRefused) before anything is stored. Once the study is
    claimed, `while_ray_starts` (if given) runs in a thread of its own while Ray starts (see connect_ray_while)."""
    corpus = prepared_corpus(spec)
    ensure_schema(settings.storage_url)
    release_unstarted_name(settings.storage_url, spec.name, spec.model_dump(mode="json"), settings.artifact_root)
    refuse_continuing_apart(settings, spec.name, corpus)
    budget_plan = first_budget_plan(spec, settings)
    claim_study(settings.storage_url, spec, document, submitted_via)
    try:
        return run_claimed_study(spec, settings, callbacks=callbacks, while_ray_starts=while_ray_starts,
                                 budget_plan=budget_plan)
    except KeyboardInterrupt:
        _finish(settings.storage_url, spec.name, "failed", f"interrupted; its running trials run again when it "
                                                             f"continues (`tuner resume {spec.name}`)")
        raise


def prepared_corpus(spec: StudySpec) -> Corpus:
    """The study's corpus, once its data is read and a model of every family fits the budget; else StudyRefused."""
    try:
        corpus = load_corpus(spec.dataset)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise StudyRefused(unreadable_data(error)) from error
    issues = task_issues(spec) + budget_issues(spec, len(corpus.vocabulary))
    if issues:
        raise StudyRefused("; ".join(issue.render(None) for issue in issues))
    return corpus


def recorded_form(artifact_root: ArtifactRoot) -> str:
    """How a study records its artifact store, and how another store is compared with it."""
    return str(artifact_root.resolve())


def refuse_continuing_apart(settings: Settings, name: str, corpus: Corpus) -> None:
    """StudyConflict where continuing the study here would split it in two: its checkpoints in two stores
    (refuse_mismatched_artifacts), or its trials on two corpora (refuse_other_corpus)."""
    refuse_mismatched_artifacts(settings.storage_url, name, settings.artifact_root)
    refuse_other_corpus(settings.storage_url, name, corpus)


def refuse_mismatched_artifacts(url: str, name: str, artifact_root: ArtifactRoot) -> None:
    """StudyConflict where the artifact store is not the study's own:
    - a study with trials that wrote its checkpoints to another store: continued here, its trials would start again
      from nothing and its best checkpoints would be split between two stores;
    - a study without trials whose name the store already holds files under: checkpoints of an earlier study of that
      name (deleted from another database, or with its database), which this one's trials would take for their own,
      since a trial resumes from the `latest.pt` in its folder."""
    with sessions(url)() as session:
        has_trials = session.scalar(select(exists().where(TrialRecord.study_name == name)))
        recorded = session.scalar(select(StudyRecord.artifact_root).where(StudyRecord.name == name))
    if has_trials:
        if recorded is not None and recorded != recorded_form(artifact_root):
            recorded, artifact_root = masked_url(recorded), masked_url(artifact_root)
            raise StudyConflict(f"artifacts: study {name!r} wrote its checkpoints to {recorded}, not {artifact_root}; "
                                f"continue it with --artifacts {recorded}")
        return
    folder = artifact_root / name
    if artifact_store.holds_files(folder):
        raise StudyConflict(f"artifacts: {masked_url(folder)} holds checkpoints of an earlier study named {name!r}, of "
                            f"which this database has no trial; its trials would resume from them. Remove that "
                            f"folder, give the study another name, or use another artifact store (--artifacts)")


def refuse_other_corpus(url: str, name: str, corpus: Corpus) -> None:
    """StudyConflict where the study has run on other tokens than `corpus` holds: its files changed since, they are
    read another way, or this machine holds other files at the same path. Continued, the study would compare trials
    trained and scored on two corpora."""
    with sessions(url)() as session:
        recorded = session.scalar(select(StudyRecord.corpus_digest).where(StudyRecord.name == name))
    if recorded is not None and recorded != corpus.digest:
        raise StudyConflict(f"dataset: {corpus.description} is not the data study {name!r} ran on (token digest "
                            f"{corpus.digest[:12]}, recorded {recorded[:12]}): its files changed, or they are read "
                            f"another way, since the study started. Restore them to continue it, or launch a new "
                            f"study on this data")


def claim_study(url: str, spec: StudySpec, document: str, submitted_via: str) -> None:
    """Record this process as the study's controller, creating the study if it is new. Of several processes
    claiming one study at once, on any backend, exactly one does; the others get a StudyConflict (tuner.store.claims).
    """
    spec_data = spec.model_dump(mode="json")
    for _ in range(CLAIM_ATTEMPTS):
        seen = claims.seen_study(url, spec.name)
        if seen is None:
            created = StudyRecord(name=spec.name, spec=spec_data, families=families_column(spec.families),
                                  document=document, submitted_via=submitted_via, status="running",
                                  controller=this_controller(), started_at=utcnow())
            if claims.created_if_absent(url, created):
                return
            continue  # another process created it meanwhile: decide on what it made
        if seen.spec != spec_data:
            raise StudyConflict(
                f"name: a study named {spec.name!r} already exists with a different spec; "
                f"give this one a new name (a relaunch continues a study only when the spec is identical)"
            )
        if seen.status in ("running", "cancelling") and seen.controller and controller_alive(seen.controller):
            raise StudyConflict(f"study {spec.name!r} is being run by process {seen.controller}")
        if claims.claimed_if_unchanged(url, seen, this_controller()):
            return
    raise StudyConflict(f"study {spec.name!r} changed hands {CLAIM_ATTEMPTS} times while this process claimed it; "
                        f"see `tuner status {spec.name}` and launch again if it is not running")


def first_budget_plan(spec: StudySpec, settings: Settings) -> BudgetPlan | None:
    """The plan of a compute-budgeted study's first run, measured here (StudyRefused where the budget buys too little);
    None for a study without a compute budget or one whose plan is stored already."""
    if spec.compute_budget is None or stored_budget_plan(settings.storage_url, spec.name) is not None:
        return None
    try:
        return measured_budget_plan(spec, slots=budget_slots(spec, settings))
    except BudgetTooSmall as error:
        raise StudyRefused(str(error)) from error


def budget_slots(spec: StudySpec, settings: Settings) -> int:
    """Trials a compute-budgeted study runs at once: as many as this machine holds, or on a Ray cluster the spec's
    concurrency."""
    return spec.tuning.concurrency if ray_address(settings) != "local" else parallel_trials(spec, this_machine())


def run_claimed_study(spec: StudySpec, settings: Settings, *, callbacks: Sequence[tune.Callback] = (),
                      while_ray_starts: Callable[[], None] | None = None,
                      budget_plan: BudgetPlan | None = None) -> str:
    """Tuning, then (as the spec asks) reruns, the test protocol and stage 2; returns the final status. Ray is
    started when a stage first needs it, or at once where `while_ray_starts` is given (see connect_ray_while). A
    compute-budgeted study keeps the plan of its first run (`budget_plan`, measured by the launch; else now)."""
    url = settings.storage_url
    try:
        corpus = prepared_corpus(spec)
        refuse_continuing_apart(settings, spec.name, corpus)  # a queued study, claimed by a worker
        vocab_size = len(corpus.vocabulary)
        with sessions(url).begin() as session:
            record = session.scalar(select(StudyRecord).where(StudyRecord.name == spec.name))
            record.corpus_digest = corpus.digest
            record.best_possible_loss = corpus.best_cross_entropy
            record.unigram_perplexity = unigram_perplexity(corpus)
            record.artifact_root = recorded_form(settings.artifact_root)  # where `tuner best` finds checkpoints
            if spec.compute_budget is not None and record.plan is None and budget_plan is not None:
                record.plan = budget_plan.model_dump(mode="json")
        if spec.compute_budget is not None:
            fixed_budget_plan(url, spec, slots=budget_slots(spec, settings))  # a worker's first run measures it here
        _fail_interrupted_trials(url, spec)
        before = last_trial_id(url, spec.name)  # the trials of this run have higher ids
        if while_ray_starts is not None:
            connect_ray_while(settings, while_ray_starts)
        _step(url, spec, lambda: tune_families(spec, vocab_size, settings, callbacks), settings)
        missing = sum(max(0, spec.tuning.trials - settled_trials(url, optuna_study_name(spec.name, f)))
                      for f in spec.families)
        if not missing and spec.reruns is not None:
            _step(url, spec, lambda: run_reruns(spec, vocab_size, settings, callbacks), settings)
        faults = store_faults(url, spec.name, after=before)
        missing = missing or len(faults)  # a rerun the store failed: evaluated once it has run again
        if not missing:  # turns scored a validation subset: the best checkpoints on the whole split
            _step(url, spec, lambda: run_full_validations(spec, settings), settings)
        if not missing and spec.evaluation is not None:
            _step(url, spec, lambda: run_test_protocols(spec, settings), settings)
        if not missing and spec.dynamic_evaluation is not None:
            for family in spec.families:
                _step(url, spec, lambda f=family: run_stage_two(spec, f, settings, callbacks), settings)
        if cancel_requested(url, spec.name):
            _fail_interrupted_trials(url, spec, CANCELLED_REASON)  # those stopped before their first report
            _finish(url, spec.name, "cancelled", CANCELLED_REASON)
            return "cancelled"
    except BaseException as error:
        _fail_interrupted_trials(url, spec)
        if not isinstance(error, KeyboardInterrupt):  # the caller records a stop: launch fails it, a worker requeues
            _finish(url, spec.name, "failed", f"{type(error).__name__}: {error}")
        raise
    if faults:
        _finish(url, spec.name, "failed", f"{len(faults)} trial(s) stopped: {faults[-1]}; once the store takes files "
                                          f"again, `tuner resume {spec.name}` runs them")
        return "failed"
    if missing:
        _finish(url, spec.name, "failed", f"stopped with {missing} trial(s) not run; launch the same spec again "
                                          f"to continue")
        return "failed"
    if not complete_tuning_trials(url, spec.name):
        _finish(url, spec.name, "failed", f"no tuning trial completed: every one failed or was stopped early "
                                          f"(`tuner status {spec.name}` shows why)")
        return "failed"
    _finish(url, spec.name, "complete", None)
    return "complete"


def _step(url: str, spec: StudySpec, work: Callable[[], None], settings: Settings) -> None:
    """Run one stage of the study unless a cancel was requested; Ray is started on first need."""
    if not cancel_requested(url, spec.name):
        connect_ray(settings)
        work()


def _fail_interrupted_trials(url: str, spec: StudySpec, reason: str = INTERRUPTED_REASON) -> None:
    """Trials left RUNNING by a controller that stopped are failed explicitly, never left as zombies.

    They are marked interrupted, so they do not count against a budget and are run again. Every Optuna
    study of the study is covered: tuning, reruns and stage 2.
    """
    storage = optuna_storage(url)
    halving = {optuna_study_name(spec.name, family) for family in spec.families} if spec.compute_budget else set()
    for name in optuna_studies_of(url, spec.name):
        if name in halving:
            continue  # successive halving resumes its configurations from their checkpoints (tuner.run.halving)
        family = name.split("/")[1]
        study_id = storage.get_study_id_from_name(name)
        for trial in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            storage.set_trial_state_values(storage_trial_id(trial), TrialState.FAIL)
            record_interrupted(url, spec.name, family, storage_trial_id(trial), trial.number,
                               trial.user_attrs.get("seed", trial_seed(spec, trial.number)), reason)


def _finish(url: str, name: str, status: str, error: str | None) -> None:
    with sessions(url).begin() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
        record.status, record.error, record.finished_at, record.controller = status, error, utcnow(), None


def connect_ray(settings: Settings) -> None:
    if ray.is_initialized():
        return
    quiet_ray()
    with signal_handlers_kept():  # how this process stops on SIGTERM is its command's choice, not Ray's
        ray.init(address=ray_address(settings), include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)


def connect_ray_while(settings: Settings, work: Callable[[], None]) -> None:
    """connect_ray, with `work` done meanwhile in another thread: while Ray starts, this process mostly waits for the
    processes Ray starts (about 3 s), which leaves time on its core. Returns once both are done; an exception from
    `work` is raised here, after Ray has started (one from Ray's start comes first)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="while-ray-starts") as helper:
        done = helper.submit(work)
        connect_ray(settings)  # here: a Ray started from another thread does not shut down cleanly (waits 60 s)
        done.result()  # leaving the block waits for the work either way


def ray_address(settings: Settings) -> str:
    """--address, else Ray's own RAY_ADDRESS, else a private local Ray. (Ray's default would attach to
    whichever cluster this machine started last, `ray start` or another program's, if one is up.)"""
    return settings.ray_address or os.environ.get("RAY_ADDRESS") or "local"


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
