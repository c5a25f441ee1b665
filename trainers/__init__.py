"""Corpora, batching, the training loop, averaging, evaluation, dynamic evaluation and checkpoints.

Each name below is loaded from its module on first use, so that importing one light module of this package (the
artifact store, the dataset registry) does not import torch with the rest: the command line reads studies without it.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={  # each name's module in this package
    "averaging": [
        "AveragingConfig", "NoAveragingConfig", "NTASGDConfig", "TailAveragingConfig", "TwoTailedAveragingConfig",
    ],
    "checkpoint": ["Checkpoint", "load_checkpoint", "load_training_state", "save_checkpoint", "sha256_of"],
    "corpus": ["EOS", "Corpus", "Vocabulary"],
    "corpus_stats": ["CorpusStatistics", "corpus_statistics", "unigram_perplexity"],
    "datasets": [
        "DatasetConfig", "LocalDatasetConfig", "RegisteredDatasetConfig", "TextDatasetConfig", "dataset_from_dict",
        "load_corpus",
    ],
    "dynamic_evaluation": ["DynamicEvaluationConfig", "dynamic_cross_entropy", "gradient_rms"],
    "evaluation": ["cross_entropy", "monte_carlo_cross_entropy"],
    "generated": ["MarkovCorpusConfig", "ReverseCopyConfig"],
    "protocol": ["MC_MULTIPLIERS", "MonteCarloResult", "ProtocolResult", "evaluate_checkpoint"],
    "registry": ["REGISTRY", "default_cache_dir", "fetch_dataset", "registered"],
    "reverse_copy_scores": ["ReverseCopyScores", "reverse_copy_scores"],
    "temperature": [
        "SearchedLoss", "TemperatureSearch", "search_logit_scale", "searched_monte_carlo_cross_entropy",
        "searched_streams_cross_entropy",
    ],
    "training": ["TrainingDiverged", "default_device", "train"],
    "training_config": ["Schedule", "TrainingConfig"],
    "training_reports": ["TrainingResult", "TurnCallback", "TurnReport"],
})
