"""Scores of the reverse-copy task that separate memory from guessing.

An example of the task (`generated.reverse_copy_corpus`) is L random symbols, <sep>, the same symbols reversed
and <eos>: 2L + 2 tokens. Only the first L are unpredictable; the reversed half is fully determined by them, so its
loss and accuracy measure what the model remembers, while the all-token loss mixes it with L unavoidable guesses
(its best is L ln(symbols) / (2L + 2) nats per token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lm_tuner.models import LanguageModel
from lm_tuner.trainers.batching import batchify, windows
from lm_tuner.trainers.evaluation import evaluation_mode, scored_tokens, streams, window_logits
from lm_tuner.trainers.generated import REVERSE_COPY_EOS_ID, REVERSE_COPY_SEP_ID
from lm_tuner.trainers.objective import token_nll


@dataclass(frozen=True)
class ReverseCopyScores:
    """Losses in nats per token; `reversed_accuracy` is the fraction of reversed symbols predicted by the argmax."""

    loss: float
    reversed_loss: float
    reversed_accuracy: float
    tokens: int
    reversed_tokens: int


def reversed_half(positions: Tensor, length: int) -> Tensor:
    """Whether each stream position holds a symbol of a reversed half (not <sep>, not <eos>): in an example of
    2L + 2 tokens, offsets L + 1 to 2L. Splits start with a whole example."""
    offsets = positions % (2 * length + 2)
    return (offsets > length) & (offsets <= 2 * length)


def _is_whole_examples(split: Tensor, length: int) -> bool:
    period = 2 * length + 2
    if length < 1 or split.numel() % period:
        return False
    examples = split.view(-1, period)
    return bool((examples[:, length] == REVERSE_COPY_SEP_ID).all() and (examples[:, -1] == REVERSE_COPY_EOS_ID).all())


def whole_examples(split: Tensor, length: int, tokens: int | None = None) -> Tensor:
    """The longest prefix of `split` within `tokens` tokens (all of it: None) made of whole examples, at least one."""
    period = 2 * length + 2
    limit = split.numel() if tokens is None else min(tokens, split.numel())
    return split[:max(period, limit - limit % period)]


@torch.no_grad()  # not inference_mode: the mogrifier's CPU kernels update their tensors in place
def reverse_copy_scores(model: LanguageModel, split: Tensor, length: int, *, batch_size: int,
                        bptt: int, logit_scale: float = 1.0) -> ReverseCopyScores:
    """The all-token loss of a reverse-copy split, and the loss and accuracy on its reversed halves only.

    `length` is the task's L (`ReverseCopyConfig.length`). The split is read as `evaluation.cross_entropy` reads it
    (same streams, windows and carried state, dropout off, logits multiplied by `logit_scale`), so `loss` equals its
    result.
    """
    if not _is_whole_examples(split, length):
        raise ValueError(f"length: got {length} for a split of {split.numel()} tokens; allowed: the task's L, where "
                         f"the split is whole examples of 2L + 2 tokens, <sep> after L symbols and <eos> last")
    batched = streams(model, split, batch_size)
    in_reversed_half = reversed_half(batchify(torch.arange(split.numel(), device=batched.device), batch_size), length)
    reversed_count = int(in_reversed_half[1:].sum().item())  # the first row is never a target
    if reversed_count == 0:
        raise ValueError(f"split: {split.numel()} tokens in {batch_size} streams hold no reversed symbol to score; "
                         f"use a smaller batch_size")
    sums = torch.zeros(3, dtype=torch.float64, device=batched.device)  # loss; reversed half: loss, right
    with evaluation_mode(model):
        for (logits, targets), (_, mask) in zip(window_logits(model, batched, bptt), windows(in_reversed_half, bptt),
                                                strict=True):
            nll = token_nll(logits, targets, logit_scale).double()
            right = (logits.argmax(dim=-1) == targets) & mask
            sums += torch.stack([nll.sum(), nll[mask].sum(), right.sum().double()])
    total, reversed_total, right_count = sums.tolist()
    count = scored_tokens(batched)
    return ReverseCopyScores(total / count, reversed_total / reversed_count, right_count / reversed_count, count,
                             reversed_count)
