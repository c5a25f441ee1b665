"""One trial as a Ray Tune function trainable: train a sampled configuration, report every turn."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from ray import tune

from trainers import TurnReport, load_corpus, sha256_of, train
from tuner.space import trial_setup
from tuner.spec import StudySpec


def checkpoint_relative_path(study: str, family: str, number: int) -> str:
    """Where a trial's best checkpoint lives inside the artifact store."""
    return f"{study}/{family}/trial-{number:05d}/best.pt"


def run_trial(config: dict[str, Any], job: dict[str, Any]) -> None:
    """Ray Tune entry point.

    `config` comes from the searcher: {"params": sampled values, "family", "number", "optuna_trial_id"};
    `job` is fixed for the whole family study: the spec and the artifact root.
    """
    spec = StudySpec.model_validate(job["spec"])
    family, number = config["family"], config["number"]
    torch.set_num_threads(max(1, int(spec.resources.cpus_per_trial)))
    corpus = load_corpus(spec.dataset)
    setup = trial_setup(spec, family, config["params"], len(corpus.vocabulary), number)
    relative = checkpoint_relative_path(spec.name, family, number)
    checkpoint = Path(job["artifact_root"]) / relative

    def report(turn: TurnReport) -> None:
        metrics: dict[str, Any] = {**asdict(turn), "finished": turn.turn == spec.training.turns}
        if turn.improved:
            metrics |= {
                "checkpoint_path": relative,
                "checkpoint_sha256": sha256_of(checkpoint),
                "checkpoint_bytes": checkpoint.stat().st_size,
            }
        tune.report(metrics)

    train(
        setup.model,
        setup.training,
        corpus,
        checkpoint_path=checkpoint,
        metadata={"study": spec.name, "family": family, "trial_number": number,
                  "dataset": spec.dataset.model_dump(mode="json")},
        on_turn=report,
    )
