"""Checkpoints that carry everything needed to use a model: weights, configuration, vocabulary.

A training checkpoint also carries the whole training state (raw weights, optimiser, averaging,
random number generators, data position, carried hidden state, progress), so a run resumed from it
continues exactly as if it had never stopped; it still loads as a plain checkpoint, with the weights
that were last evaluated.

Files are written atomically (temporary file, then rename) so a crash never leaves half a
checkpoint, and loaded with `weights_only=True` so opening one never runs code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lm_tuner.models import LanguageModel, ModelConfig
from lm_tuner.trainers.corpus import Vocabulary
from lm_tuner.trainers.files import sha256_of  # noqa: F401 (re-exported)

FORMAT = "lm-tuner/checkpoint/1"


@dataclass
class Checkpoint:
    model: LanguageModel
    vocabulary: Vocabulary
    metadata: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(path: Path, model: LanguageModel, vocabulary: Vocabulary, metadata: dict[str, Any], *,
                    training_state: dict[str, Any] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "model_config": model.config.to_dict(),
        "state_dict": {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()},
        "vocabulary": list(vocabulary.tokens),
        "metadata": metadata,
    }
    if training_state is not None:
        payload["training_state"] = training_state
    temporary = path.with_name(path.name + ".tmp")
    torch.save(payload, temporary)
    os.replace(temporary, path)


def load_checkpoint(path: Path | str, device: str | torch.device = "cpu") -> Checkpoint:
    """The model (in eval mode), its vocabulary and the metadata stored with it."""
    payload = _load(Path(path), device)
    model = LanguageModel(ModelConfig.from_dict(payload["model_config"])).to(device)
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return Checkpoint(model, Vocabulary(tuple(payload["vocabulary"])), payload["metadata"])


def load_training_state(path: Path | str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The training state of a training checkpoint (on the CPU), and the metadata stored with it."""
    path = Path(path)
    payload = _load(path, "cpu")
    if "training_state" not in payload:
        raise ValueError(f"checkpoint: {path} holds weights only, not a training state to resume from; "
                         f"resume from the run's latest checkpoint instead")
    return payload["training_state"], payload["metadata"]


def _load(path: Path, device: str | torch.device) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint: no file at {path}")
    payload = torch.load(path, map_location=device, weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"checkpoint: {path} is not an lm-tuner checkpoint (expected format {FORMAT!r})")
    return payload
