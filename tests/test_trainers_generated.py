"""The generated Markov corpus: its sampler draws the chain's law, token for token as a plain reading of it would."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lm_tuner.trainers.generated import MarkovChain, MarkovCorpusConfig, build_chain

CHAINS = [
    {},  # the demo's
    {"vocab_size": 3, "order": 1, "branching": 1},
    {"vocab_size": 5, "order": 1, "branching": 10, "eos_probability": 0.9},
    {"vocab_size": 20, "order": 3, "concentration": 0.05, "seed": 11},
    {"vocab_size": 60, "order": 2, "branching": 7, "eos_probability": 0.3, "seed": 3},
]


def reference_sample(chain: MarkovChain, length: int, rng: np.random.Generator) -> np.ndarray:
    """The chain run one draw at a time with numpy, as its definition reads."""
    cumulative = np.cumsum(chain.probabilities, axis=1)
    tokens = np.empty(length, dtype=np.int64)
    context = chain.start_context
    for t, draw in enumerate(rng.random(length)):
        choice = min(int(np.searchsorted(cumulative[context], draw, side="right")), chain.successors.shape[1] - 1)
        tokens[t] = chain.successors[context, choice]
        context = int(chain.next_context(context, tokens[t]))
    return tokens


@pytest.mark.parametrize("fields", CHAINS, ids=lambda fields: ",".join(f"{k}={v}" for k, v in fields.items()) or
                         "demo")
def test_the_sampler_draws_the_tokens_a_plain_run_of_the_chain_draws(fields) -> None:
    chain = build_chain(MarkovCorpusConfig(**fields))
    for seed in (0, 1):
        sampled = chain.sample(20_000, np.random.default_rng([seed, 1]))
        assert sampled.dtype == np.int64
        np.testing.assert_array_equal(sampled, reference_sample(chain, 20_000, np.random.default_rng([seed, 1])))


def test_a_long_sample_averages_the_chains_entropy_rate() -> None:
    chain = build_chain(MarkovCorpusConfig())
    tokens = chain.sample(200_000, np.random.default_rng(5))
    contexts = np.empty_like(tokens)
    contexts[0] = chain.start_context
    for t in range(1, len(tokens)):
        contexts[t] = chain.next_context(int(contexts[t - 1]), int(tokens[t - 1]))
    allowed = chain.successors[contexts] == tokens[:, None]
    assert allowed.any(axis=1).all()  # every token is one of its context's successors
    surprisal = -np.log((chain.probabilities[contexts] * allowed).sum(axis=1))
    assert surprisal.mean() == pytest.approx(chain.entropy_rate(), rel=0.02)
    assert math.isfinite(surprisal.mean())
