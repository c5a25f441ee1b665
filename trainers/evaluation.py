"""Static evaluation: deterministic and Monte-Carlo dropout cross-entropy, the softmax temperature
search, and the test protocol.

Every evaluation reads a split as parallel streams cut into windows, with the state carried across
windows; at batch size 1 that is one continuous stream. Losses are summed in float64, window by
window, so two evaluations that score the same windows agree exactly. The sums stay on the model's
device until the end (one synchronisation per evaluation, not one per window), and no autograd
bookkeeping is done (`torch.no_grad`; not `inference_mode`, whose tensors the mogrifier's CPU kernels may not
update in place).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lm_tuner.models import LanguageModel, monte_carlo_dropout
from lm_tuner.trainers.batching import batchify, windows
from lm_tuner.trainers.checkpoint import load_checkpoint
from lm_tuner.trainers.corpus import Corpus
from lm_tuner.trainers.objective import sample_rows, token_nll

# docs/methodology.md, "Softmax temperature": s = 1.06, 1.04, ..., 0.80, stopping after 2 values without improvement.
LOGIT_SCALES = tuple(round(1.06 - 0.02 * i, 2) for i in range(14))
TEMPERATURE_PATIENCE = 2
TEMPERATURE_TOKENS = 50_000


@contextmanager
def evaluation_mode(model: LanguageModel) -> Iterator[LanguageModel]:
    """Dropout off inside the block; the previous mode is restored on exit."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def streams(model: LanguageModel, stream: Tensor, batch_size: int) -> Tensor:
    """A split as `batch_size` parallel streams (time, batch) on the model's device, ready to be scored."""
    return batchify(stream, batch_size).to(model.output_bias.device)


def scored_tokens(batched: Tensor) -> int:
    """Tokens an evaluation of these streams scores: every token but each stream's first is a target."""
    return (batched.shape[0] - 1) * batched.shape[1]


def window_logits(model: LanguageModel, batched: Tensor, bptt: int,
                  rows_per_stream: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
    """Logits and targets of each window of `streams`, the state carried; `rows_per_stream` copies of every stream."""
    state = model.initial_state(batched.shape[1] * rows_per_stream)
    for inputs, targets in windows(batched, bptt):
        logits, state = model(sample_rows(inputs, rows_per_stream), state)
        yield logits, targets


def cross_entropy(model: LanguageModel, stream: Tensor, batch_size: int, bptt: int, *,
                  logit_scale: float = 1.0) -> float:
    """Mean negative log-likelihood in nats per token, dropout off; logits are multiplied by `logit_scale`."""
    return streams_cross_entropy(model, streams(model, stream, batch_size), bptt, logit_scale=logit_scale)


@torch.no_grad()
def streams_cross_entropy(model: LanguageModel, batched: Tensor, bptt: int, *, logit_scale: float = 1.0) -> float:
    """`cross_entropy` of a split already cut into parallel streams by `streams` (a training run cuts its
    validation split once, not at every evaluation)."""
    total = torch.zeros((), dtype=torch.float64, device=batched.device)
    with evaluation_mode(model):
        for logits, targets in window_logits(model, batched, bptt):
            total += token_nll(logits, targets, logit_scale).double().sum()
    return total.item() / scored_tokens(batched)


@torch.no_grad()
def monte_carlo_cross_entropy(model: LanguageModel, stream: Tensor, batch_size: int, bptt: int, *,
                              multiplier: float, samples: int, logit_scale: float = 1.0,
                              max_rows: int = 1024) -> float:
    """Mean negative log of the probability averaged over `samples` dropout masks, every dropout rate
    multiplied by `multiplier` (Monte-Carlo dropout evaluation).

    Each sample reads the whole split with its own masks and state. Samples run side by side along
    the batch, at most `max_rows` rows at a time.
    """
    if samples < 1:
        raise ValueError(f"samples: got {samples}; allowed: an integer >= 1")
    group = max(1, min(samples, max_rows // batch_size))
    batched = streams(model, stream, batch_size)
    log_probability_sums: list[Tensor] | None = None  # per window: ln sum over samples of p, (time, batch)
    with monte_carlo_dropout(model, multiplier):
        for first in range(0, samples, group):
            size = min(group, samples - first)
            sums = []
            for logits, targets in window_logits(model, batched, bptt, rows_per_stream=size):
                nll = token_nll(logits, sample_rows(targets, size), logit_scale)
                sums.append(torch.logsumexp(-nll.view(nll.shape[0], size, batch_size).double(), dim=1))
            log_probability_sums = sums if log_probability_sums is None else [
                torch.logaddexp(before, new) for before, new in zip(log_probability_sums, sums, strict=True)]
    total = sum((math.log(samples) - sums).sum().item() for sums in log_probability_sums)
    return total / sum(sums.numel() for sums in log_probability_sums)


@dataclass(frozen=True)
class TemperatureSearch:
    """The chosen softmax temperature s (logits are multiplied by s) and the losses of the values tried."""

    logit_scale: float
    loss: float
    losses: dict[float, float]


@torch.no_grad()
def search_logit_scale(model: LanguageModel, stream: Tensor, batch_size: int, bptt: int, *,
                       tokens: int = TEMPERATURE_TOKENS) -> TemperatureSearch:
    """Try s = 1.06, 1.04, ... on the first `tokens` tokens, stopping after 2 values without improvement.

    One forward pass scores every grid value; the stopping rule then picks among the values it would
    have tried one by one.
    """
    batched = streams(model, stream[:tokens], batch_size)
    sums = torch.zeros(len(LOGIT_SCALES), dtype=torch.float64, device=batched.device)
    with evaluation_mode(model):
        for logits, targets in window_logits(model, batched, bptt):
            sums += torch.stack([token_nll(logits, targets, scale).double().sum() for scale in LOGIT_SCALES])
    totals = dict(zip(LOGIT_SCALES, sums.tolist(), strict=True))
    count = scored_tokens(batched)
    tried: dict[float, float] = {}
    best, since_best = LOGIT_SCALES[0], 0
    for scale in LOGIT_SCALES:
        tried[scale] = totals[scale] / count
        if tried[scale] < tried[best]:
            best, since_best = scale, 0
        elif scale != best:
            since_best += 1
            if since_best == TEMPERATURE_PATIENCE:
                break
    return TemperatureSearch(best, tried[best], tried)


@dataclass(frozen=True)
class ProtocolResult:
    """Cross-entropies (nats per token) of the test protocol; `mc_*` only when Monte-Carlo samples were asked."""

    logit_scale: float
    valid: float
    test: float
    mc_valid: float | None = None
    mc_test: float | None = None


def evaluate_checkpoint(path: Path | str, corpus: Corpus, *, bptt: int = 100, search_temperature: bool = True,
                        mc_samples: int = 0, mc_multiplier: float = 0.8,
                        device: str | torch.device = "cpu") -> ProtocolResult:
    """The test protocol: the best checkpoint (holding the averaged weights it was chosen with), batch
    size 1 over each split as one continuous stream, the softmax temperature chosen on validation,
    then deterministic and, with `mc_samples`, Monte-Carlo dropout evaluation."""
    model = load_checkpoint(path, device).model
    scale = search_logit_scale(model, corpus.valid, 1, bptt).logit_scale if search_temperature else 1.0
    splits = {"valid": corpus.valid, "test": corpus.test}
    scores = {name: cross_entropy(model, split, 1, bptt, logit_scale=scale) for name, split in splits.items()}
    if mc_samples > 0:
        for name, split in splits.items():
            scores[f"mc_{name}"] = monte_carlo_cross_entropy(model, split, 1, bptt, multiplier=mc_multiplier,
                                                             samples=mc_samples, logit_scale=scale)
    return ProtocolResult(scale, **scores)
