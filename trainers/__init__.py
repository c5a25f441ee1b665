"""Corpora, batching, the training loop, averaging, evaluation, dynamic evaluation and checkpoints."""

from lm_tuner.trainers.averaging import (
    AveragingConfig,
    NoAveragingConfig,
    NTASGDConfig,
    TailAveragingConfig,
    TwoTailedAveragingConfig,
)
from lm_tuner.trainers.checkpoint import Checkpoint, load_checkpoint, load_training_state, save_checkpoint, sha256_of
from lm_tuner.trainers.corpus import EOS, Corpus, Vocabulary
from lm_tuner.trainers.corpus_stats import CorpusStatistics, corpus_statistics, unigram_perplexity
from lm_tuner.trainers.datasets import (
    DatasetConfig,
    LocalDatasetConfig,
    RegisteredDatasetConfig,
    TextDatasetConfig,
    dataset_from_dict,
    load_corpus,
)
from lm_tuner.trainers.dynamic_evaluation import DynamicEvaluationConfig, dynamic_cross_entropy, gradient_rms
from lm_tuner.trainers.evaluation import cross_entropy, monte_carlo_cross_entropy
from lm_tuner.trainers.generated import MarkovCorpusConfig, ReverseCopyConfig
from lm_tuner.trainers.protocol import MC_MULTIPLIERS, MonteCarloResult, ProtocolResult, evaluate_checkpoint
from lm_tuner.trainers.registry import REGISTRY, default_cache_dir, fetch_dataset, registered
from lm_tuner.trainers.reverse_copy_scores import ReverseCopyScores, reverse_copy_scores
from lm_tuner.trainers.temperature import (
    SearchedLoss,
    TemperatureSearch,
    search_logit_scale,
    searched_monte_carlo_cross_entropy,
    searched_streams_cross_entropy,
)
from lm_tuner.trainers.training import TrainingDiverged, default_device, train
from lm_tuner.trainers.training_config import Schedule, TrainingConfig
from lm_tuner.trainers.training_reports import TrainingResult, TurnCallback, TurnReport

__all__ = [
    "AveragingConfig",
    "Checkpoint",
    "Corpus",
    "CorpusStatistics",
    "DatasetConfig",
    "DynamicEvaluationConfig",
    "EOS",
    "LocalDatasetConfig",
    "MC_MULTIPLIERS",
    "MarkovCorpusConfig",
    "MonteCarloResult",
    "NTASGDConfig",
    "NoAveragingConfig",
    "ProtocolResult",
    "REGISTRY",
    "RegisteredDatasetConfig",
    "ReverseCopyConfig",
    "ReverseCopyScores",
    "Schedule",
    "SearchedLoss",
    "TailAveragingConfig",
    "TemperatureSearch",
    "TextDatasetConfig",
    "TrainingConfig",
    "TrainingDiverged",
    "TrainingResult",
    "TurnCallback",
    "TurnReport",
    "TwoTailedAveragingConfig",
    "Vocabulary",
    "corpus_statistics",
    "cross_entropy",
    "dataset_from_dict",
    "default_cache_dir",
    "default_device",
    "dynamic_cross_entropy",
    "evaluate_checkpoint",
    "fetch_dataset",
    "gradient_rms",
    "load_checkpoint",
    "load_corpus",
    "load_training_state",
    "monte_carlo_cross_entropy",
    "registered",
    "reverse_copy_scores",
    "save_checkpoint",
    "search_logit_scale",
    "searched_monte_carlo_cross_entropy",
    "searched_streams_cross_entropy",
    "sha256_of",
    "train",
    "unigram_perplexity",
]
