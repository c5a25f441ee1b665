"""The test protocol (docs/methodology.md, "Test protocol"): the best checkpoint scored on validation and test at
batch size 1, each split one continuous stream, deterministically and with Monte-Carlo dropout at each of the
reference's dropout multipliers, every evaluation at its own softmax temperature chosen on validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from lm_tuner.models import LanguageModel
from lm_tuner.trainers.checkpoint import load_checkpoint
from lm_tuner.trainers.corpus import Corpus
from lm_tuner.trainers.evaluation import cross_entropy, monte_carlo_cross_entropy, streams
from lm_tuner.trainers.temperature import searched_monte_carlo_cross_entropy, searched_streams_cross_entropy

MC_MULTIPLIERS = (0.6, 0.7, 0.8, 0.9)
"""Dropout multipliers of Monte-Carlo evaluation in the reference's test protocol (deepmind/lamb,
experiment/test.sh); the one with the best validation loss is reported."""


@dataclass(frozen=True)
class MonteCarloResult:
    """Monte-Carlo dropout at one multiplier: the temperature chosen for it on validation, and both losses."""

    multiplier: float
    logit_scale: float
    valid: float
    test: float


@dataclass(frozen=True)
class ProtocolResult:
    """Cross-entropies (nats per token) of the test protocol. The `mc_*` fields, only when Monte-Carlo samples
    were asked, are those of the multiplier with the best validation loss (`mc_multiplier`), each multiplier's
    in `mc_by_multiplier`."""

    logit_scale: float
    valid: float
    test: float
    mc_valid: float | None = None
    mc_test: float | None = None
    mc_multiplier: float | None = None
    mc_logit_scale: float | None = None
    mc_by_multiplier: tuple[MonteCarloResult, ...] = ()


def evaluate_checkpoint(path: Path | str, corpus: Corpus, *, bptt: int = 100, search_temperature: bool = True,
                        mc_samples: int = 0, mc_multipliers: Sequence[float] = MC_MULTIPLIERS,
                        device: str | torch.device = "cpu") -> ProtocolResult:
    """The test protocol on the checkpoint at `path` (holding the averaged weights it was chosen with). Without
    `search_temperature` every evaluation is at temperature 1."""
    if not mc_multipliers:
        raise ValueError("mc_multipliers: got none; allowed: one or more dropout multipliers in [0, 1]")
    model = load_checkpoint(path, device).model
    if search_temperature:
        searched = searched_streams_cross_entropy(model, streams(model, corpus.valid, 1), bptt)
        scale, valid = searched.logit_scale, searched.loss
    else:
        scale, valid = 1.0, cross_entropy(model, corpus.valid, 1, bptt)
    result = ProtocolResult(scale, valid, cross_entropy(model, corpus.test, 1, bptt, logit_scale=scale))
    if mc_samples == 0:
        return result
    by_multiplier = tuple(_monte_carlo(model, corpus, bptt, multiplier, mc_samples, search_temperature)
                          for multiplier in mc_multipliers)
    best = min(by_multiplier, key=lambda mc: mc.valid)
    return ProtocolResult(scale, valid, result.test, mc_valid=best.valid, mc_test=best.test,
                          mc_multiplier=best.multiplier, mc_logit_scale=best.logit_scale,
                          mc_by_multiplier=by_multiplier)


def _monte_carlo(model: LanguageModel, corpus: Corpus, bptt: int, multiplier: float, samples: int,
                 search_temperature: bool) -> MonteCarloResult:
    if search_temperature:
        searched = searched_monte_carlo_cross_entropy(model, corpus.valid, 1, bptt, multiplier=multiplier,
                                                      samples=samples)
        scale, valid = searched.logit_scale, searched.loss
    else:
        scale = 1.0
        valid = monte_carlo_cross_entropy(model, corpus.valid, 1, bptt, multiplier=multiplier, samples=samples)
    test = monte_carlo_cross_entropy(model, corpus.test, 1, bptt, multiplier=multiplier, samples=samples,
                                     logit_scale=scale)
    return MonteCarloResult(multiplier, scale, valid, test)
