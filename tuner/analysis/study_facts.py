"""What a report says beside a study's numbers: whether its status makes them provisional, which validation
set the tuning scores are on, the unigram baseline of its corpus (the score of word frequencies alone), and which
families do not beat it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lm_tuner.tuner.store.views import StudyView

PROVISIONAL_STATUSES = ("queued", "running", "cancelling")


def is_provisional(status: str) -> bool:
    """Whether a study in `status` can still change its results."""
    return status in PROVISIONAL_STATUSES


def validation_tokens(spec: dict[str, Any]) -> int | None:
    """The validation tokens the tuning scores are on, as the stored spec says (None: the full set; also for
    studies stored before `training.validation_tokens` existed)."""
    tokens = (spec.get("training") or {}).get("validation_tokens")
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def validation_label(spec: dict[str, Any]) -> str:
    """'subset of 2,000 tokens' or 'full': which validation set a study's tuning scores are on."""
    tokens = validation_tokens(spec)
    return "full" if tokens is None else f"subset of {tokens:,} tokens"


@dataclass(frozen=True)
class Baseline:
    """The unigram perplexity of the corpus's validation split, or why it is unknown."""

    perplexity: float | None
    unknown_because: str | None = None

    @property
    def loss(self) -> float | None:
        """As a cross-entropy in nats per token, the unit trials report."""
        return None if self.perplexity is None else math.log(self.perplexity)


def study_baseline(study: StudyView) -> Baseline:
    """The unigram baseline of a stored study: as stored once its corpus was read (by the process that ran it, or
    the API that checked it), else read from the corpus here."""
    if study.unigram_perplexity is not None:
        return Baseline(study.unigram_perplexity)
    return unigram_baseline(study.spec)


def unigram_baseline(spec: dict[str, Any]) -> Baseline:
    """The unigram baseline of the study's corpus, read here (a registered dataset only if it is already
    downloaded: a report never downloads). Unknown, with the reason, when the corpus cannot be read."""
    from lm_tuner.trainers import (
        RegisteredDatasetConfig,
        dataset_from_dict,
        default_cache_dir,
        load_corpus,
        registered,
        unigram_perplexity,
    )

    try:
        config = dataset_from_dict(spec["dataset"])
        if isinstance(config, RegisteredDatasetConfig):
            folder = default_cache_dir() / config.name
            if not all((folder / name).is_file() for name in registered(config.name).members):
                return Baseline(None, f"dataset {config.name!r} is not downloaded on this machine")
        return Baseline(float(unigram_perplexity(load_corpus(config))))
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        return Baseline(None, f"its corpus cannot be read here ({' '.join(str(error).split())})")


def no_better_than_baseline(baseline: Baseline, losses: Mapping[str, float | None]) -> list[str]:
    """The families whose validation loss (nats per token; None: no result yet) is not below the unigram baseline's:
    they predict no better than the corpus's word frequencies. None are named where the baseline is unknown."""
    if baseline.loss is None:
        return []
    return [family for family, loss in losses.items() if loss is not None and loss >= baseline.loss]


def baseline_warning(families: Sequence[str]) -> str | None:
    """What a report says of the families `no_better_than_baseline` found, if any."""
    if not families:
        return None
    names = ", ".join(families)
    verb = "does" if len(families) == 1 else "do"
    return (f"{names} {verb} not beat the unigram baseline (word frequencies alone): too few training steps, or "
            f"searched ranges without a working learning rate; such a score says nothing about the architecture")
