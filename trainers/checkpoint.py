"""Checkpoints that carry everything needed to use a model: weights, configuration, vocabulary.

Files are written atomically (temporary file, then rename) so a crash never leaves half a
checkpoint, and loaded with `weights_only=True` so opening one never runs code.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models import LanguageModel, ModelConfig
from trainers.corpus import Vocabulary

FORMAT = "lm-tuner/checkpoint/1"


@dataclass
class Checkpoint:
    model: LanguageModel
    vocabulary: Vocabulary
    metadata: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(path: Path, model: LanguageModel, vocabulary: Vocabulary, metadata: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "model_config": model.config.to_dict(),
        "state_dict": {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()},
        "vocabulary": list(vocabulary.tokens),
        "metadata": metadata,
    }
    temporary = path.with_name(path.name + ".tmp")
    torch.save(payload, temporary)
    os.replace(temporary, path)


def load_checkpoint(path: Path | str, device: str | torch.device = "cpu") -> Checkpoint:
    """The model (in eval mode), its vocabulary and the metadata stored with it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint: no file at {path}")
    payload = torch.load(path, map_location=device, weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"checkpoint: {path} is not an lm-tuner checkpoint (expected format {FORMAT!r})")
    model = LanguageModel(ModelConfig.from_dict(payload["model_config"])).to(device)
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return Checkpoint(model, Vocabulary(tuple(payload["vocabulary"])), payload["metadata"])


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
