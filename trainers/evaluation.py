"""Static evaluation: deterministic and Monte-Carlo dropout cross-entropy, and the constants of the
softmax temperature search (`temperature` searches; `protocol` is the test protocol).

Every evaluation reads a split as parallel streams cut into windows, with the state carried across
windows; at batch size 1 that is one continuous stream. Losses are summed in float64, window by
window, so two evaluations that score the same windows agree exactly. The sums stay on the model's
device until the end (one synchronisation per evaluation, not one per window), and no autograd
bookkeeping is done (`torch.no_grad`; not `inference_mode`, whose tensors the mogrifier's CPU kernels may not
update in place).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import islice

import torch
from torch import Tensor

from lm_tuner.models import LanguageModel, monte_carlo_dropout
from lm_tuner.trainers.batching import batchify, windows
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


CPU_LOGITS_PER_CHUNK = 640_000
"""On a CPU `scaled_nll` scores about this many logits (whole rows) at a time: the scaled copies stay small and
in cache instead of a fresh window-sized allocation per grid value (5.7 times faster for 560 rows of 10,000)."""


def scaled_nll(logits: Tensor, targets: Tensor, logit_scales: Sequence[float]) -> Tensor:
    """`token_nll` at each of `logit_scales` on the same logits, value for value: (scales, time, batch)."""
    rows, flat_targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    nll = rows.new_empty((len(logit_scales), rows.shape[0]))
    chunk = max(1, CPU_LOGITS_PER_CHUNK // rows.shape[1]) if rows.device.type == "cpu" else rows.shape[0]
    for start in range(0, rows.shape[0], chunk):
        part = slice(start, start + chunk)
        for index, scale in enumerate(logit_scales):
            nll[index, part] = token_nll(rows[part], flat_targets[part], scale)
    return nll.view(len(logit_scales), *targets.shape)


class MonteCarloSamples:
    """The `samples` dropout samples of a Monte-Carlo evaluation of `batched` (from `streams`), laid side by side
    along the batch in groups of at most `max_rows` rows. Each group carries its own state from one `next_losses`
    call to the next, so the windows can be read in stretches. Dropout must be on (`monte_carlo_dropout`)."""

    def __init__(self, model: LanguageModel, batched: Tensor, bptt: int, samples: int, max_rows: int = 1024) -> None:
        if samples < 1:
            raise ValueError(f"samples: got {samples}; allowed: an integer >= 1")
        streams_count = batched.shape[1]
        group = max(1, min(samples, max_rows // streams_count))
        self.model, self.batched, self.bptt, self.samples = model, batched, bptt, samples
        self.groups = [min(group, samples - first) for first in range(0, samples, group)]
        self.states = [model.initial_state(size * streams_count) for size in self.groups]
        self.position = 0  # windows read so far

    @torch.no_grad()
    def next_losses(self, count: int | None, logit_scales: Sequence[float]) -> Tensor:
        """-ln of each token's probability averaged over the samples, (scales, tokens), at each of `logit_scales`,
        over the next `count` windows (None: all the rest)."""
        streams_count, first = self.batched.shape[1], self.position
        window_list = list(islice(windows(self.batched, self.bptt, first * self.bptt), count))
        self.position += len(window_list)
        log_sums = self.batched.new_zeros((len(logit_scales), 0), dtype=torch.float64)  # ln sum over samples of p
        for index, size in enumerate(self.groups):
            state, per_window = self.states[index], []
            for inputs, targets in window_list:
                logits, state = self.model(sample_rows(inputs, size), state)
                nll = scaled_nll(logits, sample_rows(targets, size), logit_scales).double()
                per_window.append(torch.logsumexp(-nll.view(len(logit_scales), -1, size, streams_count), dim=2)
                                  .flatten(1))
            self.states[index] = state
            if per_window:
                sums = torch.cat(per_window, dim=1)
                log_sums = sums if index == 0 else torch.logaddexp(log_sums, sums)
        return math.log(self.samples) - log_sums


@torch.no_grad()
def monte_carlo_cross_entropy(model: LanguageModel, stream: Tensor, batch_size: int, bptt: int, *,
                              multiplier: float, samples: int, logit_scale: float = 1.0,
                              max_rows: int = 1024) -> float:
    """Mean negative log of the probability averaged over `samples` dropout masks, every dropout rate
    multiplied by `multiplier` (Monte-Carlo dropout evaluation).

    Each sample reads the whole split with its own masks and state. Samples run side by side along
    the batch, at most `max_rows` rows at a time.
    """
    batched = streams(model, stream, batch_size)
    with monte_carlo_dropout(model, multiplier):
        losses = MonteCarloSamples(model, batched, bptt, samples, max_rows).next_losses(None, (logit_scale,))
    return losses.sum().item() / losses.shape[1]
