"""What a study's data tells before anything trains: its vocabulary and split sizes (from the configuration where it
fixes them, else read from the corpus), the warnings about the data itself, and how to get a registered dataset that
is not downloaded. `tuner plan`, `tuner launch` and the REST checks ask here."""

from __future__ import annotations

from lm_tuner.trainers import load_corpus
from lm_tuner.trainers.corpus_stats import out_of_vocabulary_warnings
from lm_tuner.trainers.datasets import RegisteredDatasetConfig, known_vocabulary_size, unreadable_data
from lm_tuner.trainers.registry import how_to_get, is_fetched, registered
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.estimate import CorpusSize, known_corpus_size


class DatasetUnavailable(ValueError):
    """The study's data cannot be read (`problem`, for the dataset field); the message names the field once."""

    def __init__(self, error: Exception) -> None:
        self.problem = str(error.args[0] if error.args else error)
        super().__init__(unreadable_data(error))


def data_warnings(spec: StudySpec) -> list[str]:
    """What the data itself is warned about, where it is read from files whose vocabulary the spec does not fix: most
    of valid or test out of the vocabulary. Reads the corpus (cached): call it once the vocabulary size was read."""
    if known_vocabulary_size(spec.dataset) is not None:
        return []
    return out_of_vocabulary_warnings(load_corpus(spec.dataset))


def data_notes(spec: StudySpec) -> list[str]:
    """How to get a registered dataset that is planned without its data (its sizes are known) and not downloaded."""
    dataset = spec.dataset
    if not isinstance(dataset, RegisteredDatasetConfig) or is_fetched(registered(dataset.name)):
        return []
    return [f"dataset {dataset.name!r} is not downloaded here (a launch downloads it first): "
            f"{how_to_get(registered(dataset.name))}"]


def vocabulary_size(spec: StudySpec) -> int:
    """The vocabulary size the dataset section fixes, else that of the corpus read (fetched, as a launch would)."""
    known = known_vocabulary_size(spec.dataset)
    return known if known is not None else _loaded(spec).vocab_size


def corpus_size(spec: StudySpec) -> CorpusSize:
    """The vocabulary and split sizes the dataset section fixes (generated corpora), else those of the corpus."""
    return known_corpus_size(spec.dataset) or _loaded(spec)


def _loaded(spec: StudySpec) -> CorpusSize:
    try:
        corpus = load_corpus(spec.dataset)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise DatasetUnavailable(error) from error
    return CorpusSize(vocab_size=len(corpus.vocabulary), train_tokens=corpus.train.numel(),
                      valid_tokens=corpus.valid.numel(), test_tokens=corpus.test.numel())
