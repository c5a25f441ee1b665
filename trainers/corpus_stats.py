"""What a corpus is like before any model sees it: its size, how much of valid/test the training split's
vocabulary misses, and the perplexity of a unigram model, the baseline every language model must beat."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from lm_tuner.trainers.corpus import Corpus
from lm_tuner.trainers.text import SPLITS, UNK

UNIGRAM_MODEL = "fit on train, add-one smoothing over the vocabulary"
"""The model `unigram_perplexity` scores with, in words for reports."""


@dataclass(frozen=True)
class CorpusStatistics:
    """`tokens` and `out_of_vocabulary_rate` by split (the rate for valid and test only)."""

    vocabulary_size: int
    tokens: dict[str, int]
    out_of_vocabulary_rate: dict[str, float]
    unigram_perplexity: float


def corpus_statistics(corpus: Corpus) -> CorpusStatistics:
    return CorpusStatistics(
        vocabulary_size=len(corpus.vocabulary),
        tokens={split: _split(corpus, split).numel() for split in SPLITS},
        out_of_vocabulary_rate={split: out_of_vocabulary_rate(corpus, split) for split in ("valid", "test")},
        unigram_perplexity=unigram_perplexity(corpus),
    )


def unigram_perplexity(corpus: Corpus, split: str = "valid") -> float:
    """Perplexity of `split` under a unigram model fit on the training split with add-one smoothing.

    p(w) = (count of w in train + 1) / (train tokens + vocabulary size), over the corpus's whole vocabulary,
    <eos> and <unk> counted like any other token: the same tokens a language model of this corpus predicts.
    """
    size = len(corpus.vocabulary)
    counts = _training_counts(corpus).double() + 1.0
    log_probabilities = counts.log() - math.log(corpus.train.numel() + size)
    return math.exp(-log_probabilities[_split(corpus, split)].mean().item())


def out_of_vocabulary_rate(corpus: Corpus, split: str) -> float:
    """The fraction of `split`'s tokens that a model of the corpus cannot tell apart: <unk>, and types the
    training split never shows (possible where the vocabulary was built from every split)."""
    known = _training_counts(corpus) > 0
    if UNK in corpus.vocabulary.tokens:
        known[corpus.vocabulary.tokens.index(UNK)] = False
    return (~known[_split(corpus, split)]).double().mean().item()


HIGH_OUT_OF_VOCABULARY = 0.25
"""The out-of-vocabulary rate of valid or test above which a corpus is warned about (PTB's: 4.7% and 5.8%)."""


def out_of_vocabulary_warnings(corpus: Corpus) -> list[str]:
    """A warning per split of valid and test whose out-of-vocabulary rate is above HIGH_OUT_OF_VOCABULARY: a model of
    such data mostly learns where <unk> falls, and its perplexity says little about the text."""
    rates = {split: out_of_vocabulary_rate(corpus, split) for split in ("valid", "test")}
    return [f"dataset: {rate:.1%} of the {split} tokens are out of the vocabulary of {len(corpus.vocabulary):,} types "
            f"(<unk>, or missing from train), so scores on it mostly measure where <unk> falls; check min_count or "
            f"unknown_tokens, and that train holds the text's vocabulary"
            for split, rate in rates.items() if rate > HIGH_OUT_OF_VOCABULARY]


def types_missing_from_train(corpus: Corpus) -> int:
    """Vocabulary types the training split never shows (a vocabulary built from every split can have them)."""
    return int((_training_counts(corpus) == 0).sum().item())


def _training_counts(corpus: Corpus) -> Tensor:
    return torch.bincount(corpus.train, minlength=len(corpus.vocabulary))


def _split(corpus: Corpus, split: str) -> Tensor:
    if split not in SPLITS:
        raise ValueError(f"split: got {split!r}; allowed: {', '.join(SPLITS)}")
    return getattr(corpus, split)
