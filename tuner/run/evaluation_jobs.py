"""Evaluation work that runs on Ray workers: the test protocol on a checkpoint, a checkpoint tuned on a
validation subset scored on the whole split, and stage-2 trials.

Stage 2 tunes dynamic evaluation on validation for one checkpoint: each trial adapts the model with
sampled settings (segment length, learning rate, decay, epsilon) and reports the validation loss.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from functools import lru_cache
from typing import Any

from ray import tune
from torch import Tensor

from lm_tuner.trainers import (
    DynamicEvaluationConfig,
    cross_entropy,
    default_device,
    dynamic_cross_entropy,
    evaluate_checkpoint,
    gradient_rms,
    load_checkpoint,
    load_corpus,
    searched_streams_cross_entropy,
)
from lm_tuner.trainers.evaluation import streams
from lm_tuner.tuner.run.reporting import FAILED, OBJECTIVE, TURN
from lm_tuner.tuner.run.trial import configure_torch, study_corpus
from lm_tuner.tuner.spec import StudySpec


def run_test_protocol(spec_data: dict[str, Any], corpus_digest: str, checkpoint: str, threads: int) -> dict[str, Any]:
    """Deterministic (and, if asked, Monte-Carlo at each multiplier) validation and test losses of a checkpoint."""
    spec = StudySpec.model_validate(spec_data)
    configure_torch(spec, threads)
    settings = spec.evaluation
    result = evaluate_checkpoint(checkpoint, study_corpus(spec, corpus_digest), bptt=settings.bptt,
                                 search_temperature=settings.temperature, mc_samples=settings.mc_samples,
                                 mc_multipliers=settings.mc_multipliers, device=default_device())
    return asdict(result)


def run_full_validation(spec_data: dict[str, Any], corpus_digest: str, checkpoint: str, threads: int) -> float:
    """A checkpoint's loss on the whole validation split, scored as a turn scores it (the schedule's
    eval_batch_size and bptt), so that it stands in for the subset loss it was chosen by."""
    spec = StudySpec.model_validate(spec_data)
    configure_torch(spec, threads)
    schedule, valid = spec.training, study_corpus(spec, corpus_digest).valid
    model = load_checkpoint(checkpoint, default_device()).model
    if schedule.search_temperature:
        return searched_streams_cross_entropy(model, streams(model, valid, schedule.eval_batch_size),
                                              schedule.bptt).loss
    return cross_entropy(model, valid, schedule.eval_batch_size, schedule.bptt)


def run_dynamic_test(spec_data: dict[str, Any], corpus_digest: str, checkpoint: str, params: dict[str, Any],
                     logit_scale: float, monte_carlo: tuple[float, float] | None, threads: int) -> dict[str, float]:
    """Dynamic evaluation of both splits with the chosen settings, and with MC at `monte_carlo` (the multiplier and
    the logit scale the test protocol chose for MC) if given."""
    spec = StudySpec.model_validate(spec_data)
    configure_torch(spec, threads)
    corpus = study_corpus(spec, corpus_digest)
    model, rms = _adaptable(spec, checkpoint)
    config = DynamicEvaluationConfig(**params)
    losses = {split: dynamic_cross_entropy(model, getattr(corpus, split), rms, config, logit_scale=logit_scale)
              for split in ("valid", "test")}
    if monte_carlo is not None:
        multiplier, mc_logit_scale = monte_carlo
        for split in ("valid", "test"):
            losses[f"mc_{split}"] = dynamic_cross_entropy(
                model, getattr(corpus, split), rms, config, logit_scale=mc_logit_scale,
                mc_samples=spec.evaluation.mc_samples, mc_multiplier=multiplier)
    return losses


def run_dynamic_evaluation_trial(config: dict[str, Any], job: dict[str, Any]) -> None:
    """Ray Tune entry point of a stage-2 trial: validation loss under dynamic evaluation."""
    spec = StudySpec.model_validate(job["spec"])
    configure_torch(spec, spec.resources.cpus_per_trial)
    model, rms = _adaptable(spec, job["checkpoint"])
    try:
        corpus = study_corpus(spec, job["corpus_digest"])
        loss = dynamic_cross_entropy(model, corpus.valid, rms, DynamicEvaluationConfig(**config["params"]),
                                     logit_scale=job["logit_scale"])
    except ValueError as error:  # other data, or settings the adaptation cannot run with: recorded, not retried
        tune.report({FAILED: f"{type(error).__name__}: {error}", OBJECTIVE: math.inf, TURN: 0})
        return
    if not math.isfinite(loss):
        tune.report({FAILED: f"dynamic evaluation diverged (loss {loss})", OBJECTIVE: math.inf, TURN: 0})
        return
    tune.report({OBJECTIVE: loss, TURN: 1, "val_loss": loss, "finished": True})


def _adaptable(spec: StudySpec, checkpoint: str) -> tuple[Any, list[Tensor]]:
    stage = spec.dynamic_evaluation
    return _model_and_rms(checkpoint, spec.dataset, stage.rms_batch_size, spec.training.bptt, stage.rms_windows)


@lru_cache(maxsize=2)
def _model_and_rms(checkpoint: str, dataset: Any, batch_size: int, bptt: int,
                   windows: int | None) -> tuple[Any, list[Tensor]]:
    """The checkpoint's model and its gradient RMS statistics, computed once per worker process (a
    stage-2 study runs many trials on one checkpoint)."""
    model = load_checkpoint(checkpoint, default_device()).model
    rms = gradient_rms(model, load_corpus(dataset).train, batch_size=batch_size, bptt=bptt, max_windows=windows)
    return model, rms
