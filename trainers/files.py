"""File helpers shared by checkpoints and the dataset cache."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

CACHE_VARIABLE = "LM_TUNER_DATA"


def default_cache_dir() -> Path:
    """Where registered datasets are downloaded: `$LM_TUNER_DATA`, else ~/.cache/lm-tuner/datasets."""
    configured = os.environ.get(CACHE_VARIABLE)
    return Path(configured) if configured else Path.home() / ".cache" / "lm-tuner" / "datasets"


def sha256_of(path: Path) -> str:
    with path.open("rb") as handle:
        return sha256_of_chunks(iter(lambda: handle.read(1 << 20), b""))


def sha256_of_chunks(chunks: Iterable[bytes]) -> str:
    """The SHA-256 (hex) of the bytes `chunks` yields in turn, never held whole."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()
