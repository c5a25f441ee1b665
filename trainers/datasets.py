"""The dataset registry: a dataset configuration in, a Corpus out."""

from __future__ import annotations

from functools import lru_cache

from trainers.corpus import Corpus
from trainers.generated import MarkovCorpusConfig, markov_corpus

DatasetConfig = MarkovCorpusConfig
"""Every dataset configuration the registry accepts (a union once more sources exist)."""


@lru_cache(maxsize=4)
def load_corpus(config: DatasetConfig) -> Corpus:
    """Build (or fetch from this process's cache) the corpus a configuration describes."""
    if isinstance(config, MarkovCorpusConfig):
        return markov_corpus(config)
    raise TypeError(f"dataset: unsupported configuration {type(config).__name__}")


def dataset_from_dict(data: dict) -> DatasetConfig:
    return MarkovCorpusConfig.model_validate(data)
