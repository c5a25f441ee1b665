"""File helpers shared by checkpoints and the dataset cache."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CACHE_VARIABLE = "LM_TUNER_DATA"


def default_cache_dir() -> Path:
    """Where registered datasets are downloaded: `$LM_TUNER_DATA`, else ~/.cache/lm-tuner/datasets."""
    configured = os.environ.get(CACHE_VARIABLE)
    return Path(configured) if configured else Path.home() / ".cache" / "lm-tuner" / "datasets"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
