"""Which validation tokens a turn scores, and as how many parallel streams (`training.validation_tokens`).

The trainer cuts its validation split this way once per run; the plan's estimates and probe count the same tokens
and streams without the data.
"""

from __future__ import annotations

from dataclasses import dataclass

from lm_tuner.trainers.training_config import Schedule

SUBSET_STREAM_TOKENS = 2_500
"""A validation subset is scored as streams at least this long (at most eval_batch_size of them). Every stream starts
from a zero state: on PTB the first 10,000 validation tokens scored 17% higher in perplexity as 32 streams of 312
tokens than as one stream, and 2.6% higher as 4 streams of 2,500 (benchmarks/validation_streams.py)."""


@dataclass(frozen=True)
class ValidationCut:
    """The first `tokens` tokens of the validation split, as `streams` parallel streams."""

    tokens: int
    streams: int
    subset: bool  # fewer tokens than the whole split

    @property
    def scored(self) -> int:
        """Tokens each evaluation scores: every token but each stream's first is a target."""
        return max(1, (self.tokens // self.streams - 1) * self.streams)


def subset_streams(tokens: int, eval_batch_size: int) -> int:
    """Parallel streams a validation subset of `tokens` tokens is scored as: as many as eval_batch_size allows, but
    none shorter than SUBSET_STREAM_TOKENS (one, when the subset is shorter)."""
    return max(1, min(eval_batch_size, tokens // SUBSET_STREAM_TOKENS))


def validation_cut(schedule: Schedule, valid_tokens: int) -> ValidationCut:
    """The schedule's subset of a split of `valid_tokens` tokens, or the whole split in eval_batch_size streams."""
    tokens = min(schedule.validation_tokens or valid_tokens, valid_tokens)
    subset = tokens < valid_tokens
    return ValidationCut(tokens, subset_streams(tokens, schedule.eval_batch_size) if subset
                         else schedule.eval_batch_size, subset)
