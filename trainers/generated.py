"""A generated corpus with a known entropy rate, for demos and tests without downloads.

Sentences come from a random sparse Markov chain of order k: the next token depends on the last k
tokens of the current sentence (padded with <eos> at its start), ends the sentence with probability
`eos_probability`, and otherwise picks one of `branching` successors with Dirichlet weights. Every
sentence restarts from the same context, so the process is ergodic and its entropy rate — the best
cross-entropy any model can reach — is computed exactly from the stationary distribution.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from lm_tuner.trainers.corpus import EOS, Corpus, Vocabulary

MAX_CONTEXTS = 1_000_000  # a chain's contexts (vocab_size ** order) are drawn one by one, about 30 us each


class MarkovCorpusConfig(BaseModel):
    """A sparse order-k Markov text; deterministic given its fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generator: Literal["markov"] = "markov"
    vocab_size: int = Field(48, ge=3, le=5000, description="token types, <eos> included")
    order: int = Field(2, ge=1, le=3, description="how many previous tokens the next one depends on")
    branching: int = Field(4, ge=1, description="possible successors of each context")
    eos_probability: float = Field(0.05, gt=0, lt=1, description="chance that a sentence ends after a token")
    concentration: float = Field(0.5, gt=0, description="Dirichlet concentration of successor weights")
    # bounded: a process that generates a corpus holds it in memory (100M tokens: 0.8 GB), whoever asked for it
    train_tokens: int = Field(100_000, ge=100, le=100_000_000)
    valid_tokens: int = Field(10_000, ge=100, le=10_000_000)
    test_tokens: int = Field(10_000, ge=100, le=10_000_000)
    seed: int = Field(0, ge=0, description="seeds the generator")

    @model_validator(mode="after")
    def _chain_is_buildable(self) -> MarkovCorpusConfig:
        contexts = self.vocab_size ** self.order
        if contexts > MAX_CONTEXTS:
            raise ValueError(f"vocab_size ** order is {contexts:,} contexts, over the {MAX_CONTEXTS:,} a generated "
                             f"corpus draws (about 30 s, in every trial's process): lower vocab_size or order")
        return self


@dataclass(frozen=True)
class MarkovChain:
    """Successor ids and probabilities per context; column 0 is always <eos> (id 0)."""

    vocab_size: int
    order: int
    successors: np.ndarray  # (contexts, branching + 1) int
    probabilities: np.ndarray  # (contexts, branching + 1) float

    @property
    def start_context(self) -> int:
        return 0  # all-<eos> padding

    def next_context(self, context: np.ndarray | int, token: np.ndarray | int) -> np.ndarray | int:
        shifted = (context * self.vocab_size) % (self.vocab_size**self.order) + token
        return np.where(token == 0, self.start_context, shifted)

    def entropy_rate(self, iterations: int = 10_000, tolerance: float = 1e-13) -> float:
        """Nats per token under the stationary distribution over contexts."""
        contexts = self.successors.shape[0]
        targets = self.next_context(np.arange(contexts)[:, None], self.successors)
        distribution = np.zeros(contexts)
        distribution[self.start_context] = 1.0
        for _ in range(iterations):
            updated = np.bincount(targets.ravel(), (distribution[:, None] * self.probabilities).ravel(), contexts)
            updated = 0.5 * (distribution + updated)  # lazy chain: same stationary law, no periodicity
            converged = np.abs(updated - distribution).sum() < tolerance
            distribution = updated
            if converged:
                break
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = np.where(self.probabilities > 0, self.probabilities * np.log(self.probabilities), 0.0)
        return float(-(distribution * plogp.sum(axis=1)).sum())

    def sample(self, length: int, rng: np.random.Generator) -> np.ndarray:
        # One token at a time, as the chain runs, on flat memoryviews: indexing one yields a Python number, without
        # numpy's per-call overhead on scalars, which made this loop ten times slower (1.3 s for the demo's 120,000
        # tokens, paid in every trial's process).
        width = self.successors.shape[1]
        cumulative = memoryview(np.cumsum(self.probabilities, axis=1).ravel())
        successors = memoryview(np.ascontiguousarray(self.successors).ravel())
        contexts = self.vocab_size**self.order
        tokens = []
        context = self.start_context
        for draw in rng.random(length).tolist():
            row = context * width
            token = successors[min(bisect.bisect_right(cumulative, draw, row, row + width), row + width - 1)]
            tokens.append(token)
            context = self.start_context if token == 0 else (context * self.vocab_size) % contexts + token
        return np.array(tokens, dtype=np.int64)


def build_chain(config: MarkovCorpusConfig) -> MarkovChain:
    rng = np.random.default_rng(config.seed)
    contexts = config.vocab_size**config.order
    words = config.vocab_size - 1
    branching = min(config.branching, words)
    successors = np.empty((contexts, branching + 1), dtype=np.int64)
    probabilities = np.empty((contexts, branching + 1))
    successors[:, 0] = 0
    probabilities[:, 0] = config.eos_probability
    for context in range(contexts):
        successors[context, 1:] = 1 + rng.choice(words, size=branching, replace=False)
        weights = rng.dirichlet(np.full(branching, config.concentration))
        probabilities[context, 1:] = (1.0 - config.eos_probability) * weights
    return MarkovChain(config.vocab_size, config.order, successors, probabilities)


def markov_corpus(config: MarkovCorpusConfig) -> Corpus:
    chain = build_chain(config)
    rng = np.random.default_rng([config.seed, 1])
    total = config.train_tokens + config.valid_tokens + config.test_tokens
    stream = torch.from_numpy(chain.sample(total, rng))
    train_end = config.train_tokens
    valid_end = train_end + config.valid_tokens
    width = len(str(config.vocab_size - 1))
    vocabulary = Vocabulary((EOS, *(f"w{i:0{width}d}" for i in range(1, config.vocab_size))))
    entropy_rate = chain.entropy_rate()
    return Corpus(
        vocabulary=vocabulary,
        train=stream[:train_end],
        valid=stream[train_end:valid_end],
        test=stream[valid_end:],
        description=(f"markov order {config.order}, {config.vocab_size} types, "
                     f"best possible perplexity {math.exp(entropy_rate):.3f}"),
        best_cross_entropy=entropy_rate,
    )


class ReverseCopyConfig(BaseModel):
    """The reverse copy task of the Mogrifier paper (Melis et al. 2020, section 5) as one token stream.

    Each example is `length` symbols drawn uniformly from `symbols`, a <sep> marker, the same symbols
    in reverse order, and <eos>. Only the first half of an example is unpredictable, so the best
    possible cross-entropy is length * ln(symbols) / (2 * length + 2) nats per token. The paper used
    1000 symbols and 500,000 / 10,000 / 10,000 examples; the defaults here are demo-sized.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    generator: Literal["reverse-copy"] = "reverse-copy"
    symbols: int = Field(100, ge=2, le=100_000, description="distinct symbols to copy")
    length: int = Field(20, ge=1, le=10_000, description="symbols per example before the <sep> marker")
    # bounded: a process that generates a corpus holds it in memory, whoever asked for it
    train_examples: int = Field(5_000, ge=1, le=1_000_000)
    valid_examples: int = Field(500, ge=1, le=100_000)
    test_examples: int = Field(500, ge=1, le=100_000)
    seed: int = Field(0, ge=0, description="seeds the generator")


SEP = "<sep>"
REVERSE_COPY_EOS_ID, REVERSE_COPY_SEP_ID = 0, 1
"""The ids of <eos> and <sep> in a reverse-copy vocabulary; the symbols follow them."""


def reverse_copy_corpus(config: ReverseCopyConfig) -> Corpus:
    width = len(str(config.symbols - 1))
    vocabulary = Vocabulary((EOS, SEP, *(f"s{i:0{width}d}" for i in range(config.symbols))))
    eos, sep, first_symbol = REVERSE_COPY_EOS_ID, REVERSE_COPY_SEP_ID, 2

    def examples(count: int, stream: int) -> torch.Tensor:
        rng = np.random.default_rng([config.seed, stream])
        inputs = first_symbol + rng.integers(0, config.symbols, size=(count, config.length))
        markers = np.full((count, 1), sep)
        ends = np.full((count, 1), eos)
        return torch.from_numpy(np.concatenate([inputs, markers, inputs[:, ::-1], ends], axis=1).ravel())

    best = config.length * math.log(config.symbols) / (2 * config.length + 2)
    return Corpus(
        vocabulary=vocabulary,
        train=examples(config.train_examples, 0),
        valid=examples(config.valid_examples, 1),
        test=examples(config.test_examples, 2),
        description=(f"reverse copy of {config.length} symbols out of {config.symbols}, "
                     f"best possible perplexity {math.exp(best):.3f}"),
        best_cross_entropy=best,
        reverse_copy_length=config.length,
    )
