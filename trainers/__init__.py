"""Corpora, batching, the training loop, averaging, evaluation, dynamic evaluation and checkpoints.

Each name below is loaded from its module on first use, so that importing one light module of this package (the
artifact store, the dataset registry) does not import torch with the rest: the command line reads studies without it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {  # name: the module of this package that defines it
    "AveragingConfig": "averaging", "NoAveragingConfig": "averaging", "NTASGDConfig": "averaging",
    "TailAveragingConfig": "averaging", "TwoTailedAveragingConfig": "averaging",
    "Checkpoint": "checkpoint", "load_checkpoint": "checkpoint", "load_training_state": "checkpoint",
    "save_checkpoint": "checkpoint", "sha256_of": "checkpoint",
    "EOS": "corpus", "Corpus": "corpus", "Vocabulary": "corpus",
    "CorpusStatistics": "corpus_stats", "corpus_statistics": "corpus_stats", "unigram_perplexity": "corpus_stats",
    "DatasetConfig": "datasets", "LocalDatasetConfig": "datasets", "RegisteredDatasetConfig": "datasets",
    "TextDatasetConfig": "datasets", "dataset_from_dict": "datasets", "load_corpus": "datasets",
    "DynamicEvaluationConfig": "dynamic_evaluation", "dynamic_cross_entropy": "dynamic_evaluation",
    "gradient_rms": "dynamic_evaluation",
    "cross_entropy": "evaluation", "monte_carlo_cross_entropy": "evaluation",
    "MarkovCorpusConfig": "generated", "ReverseCopyConfig": "generated",
    "MC_MULTIPLIERS": "protocol", "MonteCarloResult": "protocol", "ProtocolResult": "protocol",
    "evaluate_checkpoint": "protocol",
    "REGISTRY": "registry", "default_cache_dir": "registry", "fetch_dataset": "registry", "registered": "registry",
    "ReverseCopyScores": "reverse_copy_scores", "reverse_copy_scores": "reverse_copy_scores",
    "SearchedLoss": "temperature", "TemperatureSearch": "temperature", "search_logit_scale": "temperature",
    "searched_monte_carlo_cross_entropy": "temperature", "searched_streams_cross_entropy": "temperature",
    "TrainingDiverged": "training", "default_device": "training", "train": "training",
    "Schedule": "training_config", "TrainingConfig": "training_config",
    "TrainingResult": "training_reports", "TurnCallback": "training_reports", "TurnReport": "training_reports",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
