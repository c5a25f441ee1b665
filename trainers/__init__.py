"""Corpora, batching, the training loop, evaluation and checkpoints."""

from trainers.checkpoint import Checkpoint, load_checkpoint, save_checkpoint, sha256_of
from trainers.corpus import EOS, Corpus, Vocabulary
from trainers.datasets import DatasetConfig, dataset_from_dict, load_corpus
from trainers.evaluation import cross_entropy
from trainers.generated import MarkovCorpusConfig
from trainers.training import (
    Schedule,
    TrainingConfig,
    TrainingDiverged,
    TrainingResult,
    TurnCallback,
    TurnReport,
    default_device,
    train,
)

__all__ = [
    "EOS",
    "Checkpoint",
    "Corpus",
    "DatasetConfig",
    "MarkovCorpusConfig",
    "Schedule",
    "TrainingConfig",
    "TrainingDiverged",
    "TrainingResult",
    "TurnCallback",
    "TurnReport",
    "Vocabulary",
    "cross_entropy",
    "dataset_from_dict",
    "default_device",
    "load_checkpoint",
    "load_corpus",
    "save_checkpoint",
    "sha256_of",
    "train",
]
