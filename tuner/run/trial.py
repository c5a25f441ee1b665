"""One trial as a Ray Tune function trainable: train a sampled configuration, report every turn."""

from __future__ import annotations

import math
import socket
from contextlib import ExitStack
from dataclasses import asdict, replace
from typing import Any

import torch
from ray import tune

from lm_tuner.trainers import Corpus, TrainingDiverged, TurnReport, artifact_store, load_corpus, train
from lm_tuner.trainers.heap import keep_freed_memory
from lm_tuner.tuner.run.reporting import FAILED, INFRASTRUCTURE, OBJECTIVE, TURN
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.space import TrialSetup, trial_setup


def checkpoint_relative_path(study: str, family: str, number: int, kind: str = "best", stage: str = "tune") -> str:
    """Where a trial's checkpoints live inside the artifact store: `best` (its result) and `latest`
    (the full training state after its last turn, from which a restarted trial resumes). Reruns are
    numbered in their own Optuna study, so they live in a folder of their own."""
    folder = f"{study}/{family}" if stage == "tune" else f"{study}/{family}/{stage}"
    return f"{folder}/trial-{number:05d}/{kind}.pt"


def configure_torch(spec: StudySpec, threads: float) -> None:
    """This process's torch threads, float32 matrix-multiply precision and malloc policy, for a job of `spec`."""
    keep_freed_memory()
    torch.set_num_threads(max(1, int(threads)))
    torch.set_float32_matmul_precision(spec.resources.float32_matmul_precision)


class OtherCorpus(ValueError):
    """This process reads other tokens at the study's dataset than the study's controller read."""


def corpus_digest(spec: StudySpec) -> str:
    """The digest of the study's tokens as this process (the controller) reads them: what every job on a worker
    checks its own read against (study_corpus)."""
    return load_corpus(spec.dataset).digest


def study_corpus(spec: StudySpec, controller_digest: str) -> Corpus:
    """The study's corpus as this process reads it, checked against the digest of its controller's read: a Ray node
    with other files at the dataset's path, or files changed since, raise OtherCorpus instead of being trained or
    scored on."""
    corpus = load_corpus(spec.dataset)
    if corpus.digest != controller_digest:
        raise OtherCorpus(f"dataset: {corpus.description} on {socket.gethostname()} is not the data the study's "
                          f"controller read (token digest {corpus.digest[:12]}, the controller's "
                          f"{controller_digest[:12]}); give every machine the same files")
    return corpus


def training_job(spec: StudySpec, artifact_root: str) -> dict[str, Any]:
    """What every training trial of a study is given beside its sampled configuration (run_trial's `job`)."""
    return {"spec": spec.model_dump(mode="json"), "artifact_root": artifact_root, "corpus_digest": corpus_digest(spec)}


def compute_seconds(turn: TurnReport, gpus: float) -> float:
    """The device time a run has used so far: GPU-seconds (wall-clock seconds times the GPUs it holds) on GPUs,
    else CPU core-seconds (the training process's CPU time, all its threads), which other load does not inflate."""
    return turn.wall_seconds * gpus if gpus > 0 else turn.process_seconds


def run_trial(config: dict[str, Any], job: dict[str, Any]) -> None:
    """Ray Tune entry point.

    `config` comes from the searcher: {"params": sampled values, "family", "number", "optuna_trial_id",
    "seed", "stage"}, and under a compute budget (tuner.run.halving) "budget_steps", the steps of the family's top
    rung, and "until_step", where this segment of the trial ends (a rung);
    `job` is fixed for the whole family study (training_job): the spec, the artifact root (a folder, or an
    object-storage URL the worker writes to directly) and the digest of the corpus as the controller read it.
    """
    spec = StudySpec.model_validate(job["spec"])
    family, number = config["family"], config["number"]
    configure_torch(spec, spec.resources.cpus_per_trial)
    try:
        corpus = study_corpus(spec, job["corpus_digest"])
        setup = with_budget_steps(trial_setup(spec, family, config["params"], len(corpus.vocabulary), config["seed"]),
                                  config.get("budget_steps"))
        _train(spec, family, number, config.get("stage", "tune"), setup, corpus, job["artifact_root"],
               config.get("until_step"))
    except (TrainingDiverged, ValueError) as error:
        # The configuration itself cannot be trained: report the reason instead of raising, so Ray
        # does not retry on another worker what no retry can fix (retries are for lost workers).
        # Ray requires the metric in every result: +inf (worst) keeps schedulers' rungs honest, and the
        # searcher never tells Optuna a number for a failed trial.
        tune.report({FAILED: f"{type(error).__name__}: {error}", OBJECTIVE: math.inf, TURN: 0})
    except artifact_store.StoreWriteError as error:
        # The store's fault, not the configuration's: reported (a traceback would tell no more than the message),
        # not retried here (the store stays full), and run again when the study is resumed.
        tune.report({FAILED: str(error), INFRASTRUCTURE: True, OBJECTIVE: math.inf, TURN: 0})


def with_budget_steps(setup: TrialSetup, steps: int | None) -> TrialSetup:
    """The setup trained for `steps` optimisation steps (the top rung of a compute-budgeted study), unless None."""
    if steps is None:
        return setup
    schedule = setup.training.schedule.model_copy(update={"budget_steps": steps})
    return replace(setup, training=setup.training.model_copy(update={"schedule": schedule}))


def _train(spec: StudySpec, family: str, number: int, stage: str, setup: TrialSetup, corpus: Corpus,
           artifact_root: str, until_step: int | None = None) -> None:
    relative = checkpoint_relative_path(spec.name, family, number, stage=stage)
    checkpoint = artifact_store.join(artifact_root, relative)
    latest = artifact_store.join(artifact_root, checkpoint_relative_path(spec.name, family, number, "latest", stage))

    gpus = spec.resources.gpus_per_trial

    def report(turn: TurnReport) -> None:
        metrics: dict[str, Any] = {**asdict(turn), "finished": turn.final,
                                   "compute_seconds": compute_seconds(turn, gpus)}
        if turn.checkpoint_sha256 is not None:  # with its hash and size, as written (no read back)
            metrics["checkpoint_path"] = relative
        tune.report(metrics)

    with ExitStack() as stack:
        # A trial restarted after its worker or node died continues where its last turn left it, from a local
        # copy of its latest checkpoint (downloaded first where the artifact store is object storage).
        resume_from = stack.enter_context(artifact_store.local_copy(latest)) if artifact_store.exists(latest) \
            else None
        train(
            setup.model,
            setup.training,
            corpus,
            checkpoint_path=checkpoint,
            latest_checkpoint_path=latest,
            resume_from=resume_from,
            metadata={"study": spec.name, "family": family, "trial_number": number,
                      "dataset": spec.dataset.model_dump(mode="json")},
            on_turn=report,
            stop_at_step=until_step,
            report_restored=resume_from is not None,  # its controller may have stopped before recording the last
        )
