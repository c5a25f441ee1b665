"""The softmax temperature search (docs/methodology.md, "Softmax temperature"), run inside the evaluation
whose score it is for.

As in the reference (deepmind/lamb, `evaluation.evaluate_all`), logits are multiplied by s = 1.06, 1.04, ...,
0.80, tried in that order on the first windows of the validation streams (about `TEMPERATURE_TOKENS` tokens)
with the same evaluation (deterministic, or Monte-Carlo dropout with its multiplier and samples) as the score,
stopping after `TEMPERATURE_PATIENCE` values without improvement; the score is then the loss at the chosen
value. Here one forward pass scores every grid value on the same logits (and, under Monte-Carlo dropout, the
same masks) and the stopping rule picks among the values it would have tried one by one. The search windows
are the first windows of the evaluation itself, which goes on at the chosen value: searching costs no
forward pass of its own, only the log-softmaxes of the other grid values on those windows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

import torch
from torch import Tensor

from lm_tuner.models import LanguageModel, monte_carlo_dropout
from lm_tuner.trainers.evaluation import (
    LOGIT_SCALES,
    TEMPERATURE_PATIENCE,
    TEMPERATURE_TOKENS,
    MonteCarloSamples,
    evaluation_mode,
    scaled_nll,
    scored_tokens,
    streams,
    window_logits,
)
from lm_tuner.trainers.objective import token_nll


@dataclass(frozen=True)
class TemperatureSearch:
    """The chosen softmax temperature s (logits are multiplied by s), its loss on the search windows, and the
    losses of the values tried, in order."""

    logit_scale: float
    loss: float
    losses: dict[float, float]


@dataclass(frozen=True)
class SearchedLoss:
    """The mean loss over every scored token at the temperature `search` chose on the first windows."""

    loss: float
    search: TemperatureSearch

    @property
    def logit_scale(self) -> float:
        return self.search.logit_scale


def search_windows(streams: int, bptt: int, tokens: int = TEMPERATURE_TOKENS) -> int:
    """Windows the search reads of `streams` parallel streams: as many whole windows as fit in `tokens`, at least
    one (the reference's max(1, tokens // batch_size // bptt) batches)."""
    return max(1, tokens // (streams * bptt))


def patience_search(losses: Sequence[float]) -> TemperatureSearch:
    """The values of `LOGIT_SCALES` (whose losses are `losses`, in that order) tried one by one: the best so far
    is kept, and the walk stops after `TEMPERATURE_PATIENCE` values in a row that do not beat it."""
    tried: dict[float, float] = {}
    best = LOGIT_SCALES[0]
    for index, (scale, loss) in enumerate(zip(LOGIT_SCALES, losses, strict=True)):
        tried[scale] = loss
        if loss < tried[best]:
            best = scale
        if index - LOGIT_SCALES.index(best) == TEMPERATURE_PATIENCE:
            break
    return TemperatureSearch(best, tried[best], tried)


def _searched_sums(readings: Iterator[tuple[Tensor, Tensor]], count: int) -> tuple[TemperatureSearch, Tensor]:
    """The search on the next `count` windows of `readings`, and the float64 loss sums of every grid value on them."""
    sums, tokens = None, 0
    for logits, targets in islice(readings, count):
        window = torch.stack([nll.double().sum() for nll in scaled_nll(logits, targets, LOGIT_SCALES)])
        sums, tokens = window if sums is None else sums + window, tokens + targets.numel()
    return patience_search((sums / tokens).tolist()), sums


@torch.no_grad()
def searched_streams_cross_entropy(model: LanguageModel, batched: Tensor, bptt: int, *,
                                   tokens: int = TEMPERATURE_TOKENS) -> SearchedLoss:
    """`streams_cross_entropy` at the temperature chosen on the first windows of `batched` (`search_windows`),
    in one forward pass (and one more synchronisation, where the search ends); equal to `streams_cross_entropy`
    at that temperature."""
    with evaluation_mode(model):
        readings = window_logits(model, batched, bptt)
        search, sums = _searched_sums(readings, search_windows(batched.shape[1], bptt, tokens))
        total = sums[LOGIT_SCALES.index(search.logit_scale)]
        for logits, targets in readings:
            total = total + token_nll(logits, targets, search.logit_scale).double().sum()
    return SearchedLoss(total.item() / scored_tokens(batched), search)


@torch.no_grad()
def search_logit_scale(model: LanguageModel, stream: Tensor, batch_size: int, bptt: int, *,
                       tokens: int = TEMPERATURE_TOKENS) -> TemperatureSearch:
    """The deterministic search alone, on the first windows of `stream` read as `batch_size` parallel streams."""
    batched = streams(model, stream, batch_size)
    with evaluation_mode(model):
        return _searched_sums(window_logits(model, batched, bptt), search_windows(batched.shape[1], bptt, tokens))[0]


@torch.no_grad()
def searched_monte_carlo_cross_entropy(model: LanguageModel, stream: Tensor, batch_size: int, bptt: int, *,
                                       multiplier: float, samples: int, tokens: int = TEMPERATURE_TOKENS,
                                       max_rows: int = 1024) -> SearchedLoss:
    """`monte_carlo_cross_entropy` at the temperature chosen, with the same Monte-Carlo evaluation, on the first
    windows of the split (`search_windows`): every sample reads the split once."""
    batched = streams(model, stream, batch_size)
    with monte_carlo_dropout(model, multiplier):
        samples_read = MonteCarloSamples(model, batched, bptt, samples, max_rows)
        searched = samples_read.next_losses(search_windows(batched.shape[1], bptt, tokens), LOGIT_SCALES)
        search = patience_search((searched.sum(dim=1) / searched.shape[1]).tolist())
        rest = samples_read.next_losses(None, (search.logit_scale,))
    total = searched[LOGIT_SCALES.index(search.logit_scale)].sum() + rest.sum()
    return SearchedLoss(total.item() / scored_tokens(batched), search)
