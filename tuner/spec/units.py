"""The unit a study's scores are shown in: perplexity for word-level corpora, bits per character for
character-level ones (docs/methodology.md, evaluation)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded where a column is converted: the reports that show single scores skip 0.3 s of imports
    import numpy as np
    import pandas as pd

LARGEST_EXP_ARGUMENT = math.log(sys.float_info.max)  # beyond it a float's exp is infinite

CHARACTER_LEVEL_CORPORA = ("ptb-char", "enwik8", "text8")  # scored in bits per character


@dataclass(frozen=True)
class Unit:
    name: str  # "perplexity" or "bpc"
    title: str

    def convert(self, losses: pd.Series | np.ndarray) -> np.ndarray:
        import numpy as np

        values = np.asarray(losses, dtype=float)
        return values / math.log(2) if self.name == "bpc" else np.exp(values)

    def of(self, loss: float | None) -> float | None:
        """One score, as `convert` gives it (an infinite perplexity for a loss beyond a float's exp)."""
        if loss is None:
            return None
        if self.name == "bpc":
            return loss / math.log(2)
        return math.inf if loss > LARGEST_EXP_ARGUMENT else math.exp(loss)


def is_character_level(dataset: dict[str, Any]) -> bool:
    """Whether a dataset section (as stored with a study) names a character-level corpus: a character-level
    format, or a plain-text corpus read at `level: char`."""
    if dataset.get("format") == "text":
        return dataset.get("level") == "char"
    return (dataset.get("name") or dataset.get("format")) in CHARACTER_LEVEL_CORPORA


def unit_of(spec: dict[str, Any]) -> Unit:
    """The unit of a study's scores, from its spec as stored."""
    if is_character_level(spec.get("dataset", {})):
        return Unit("bpc", "validation bits per character")
    return Unit("perplexity", "validation perplexity")
