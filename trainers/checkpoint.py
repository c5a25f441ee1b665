"""Checkpoints that carry everything needed to use a model: weights, configuration, vocabulary.

A training checkpoint also carries the whole training state (raw weights, optimiser, averaging,
random number generators, data position, carried hidden state, progress), so a run resumed from it
continues exactly as if it had never stopped; it still loads as a plain checkpoint, with the weights
that were last evaluated.

Checkpoints live in the artifact store, a local folder or object storage (trainers.artifact_store). They are
written atomically (a temporary file, then a rename or a single upload) so a crash never leaves half a
checkpoint, and loaded with `weights_only=True` so opening one never runs code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from lm_tuner.models import LanguageModel, ModelConfig
from lm_tuner.trainers import artifact_store
from lm_tuner.trainers.artifact_store import Location
from lm_tuner.trainers.corpus import Vocabulary
from lm_tuner.trainers.files import sha256_of  # noqa: F401 (re-exported)

FORMAT = "lm-tuner/checkpoint/1"


@dataclass
class Checkpoint:
    model: LanguageModel
    vocabulary: Vocabulary
    metadata: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(path: Location, model: LanguageModel, vocabulary: Vocabulary, metadata: dict[str, Any], *,
                    training_state: dict[str, Any] | None = None) -> artifact_store.StoredFile:
    payload = {
        "format": FORMAT,
        "model_config": model.config.to_dict(),
        "state_dict": {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()},
        "vocabulary": list(vocabulary.tokens),
        "metadata": metadata,
    }
    if training_state is not None:
        payload["training_state"] = training_state
    return artifact_store.write_atomically(path, lambda temporary: _save(payload, temporary))


def _save(payload: dict[str, Any], path: Path) -> None:
    """torch.save into `path` through a Python file, so that a failed write says what happened: writing a path
    itself, torch reports a full disk as "unexpected pos 64 vs 0", and the OSError raised by a write to a Python
    file it holds back as the same RuntimeError."""
    with path.open("wb") as handle:
        writer = _FailureKeepingWriter(handle)
        try:
            torch.save(payload, writer)
        except RuntimeError:
            if writer.failure is None:
                raise
            raise writer.failure from None


class _FailureKeepingWriter:
    """A binary file's write and flush, keeping the first OSError either raised (torch.save's writer swallows it)."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.failure: OSError | None = None

    def write(self, data: bytes) -> int:
        return self._kept(self._handle.write, data)

    def flush(self) -> None:
        self._kept(self._handle.flush)

    def _kept(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as error:
            self.failure = self.failure or error
            raise


def load_checkpoint(path: Location, device: str | torch.device = "cpu") -> Checkpoint:
    """The model (in eval mode), its vocabulary and the metadata stored with it."""
    payload = _load(path, device)
    model = LanguageModel(ModelConfig.from_dict(payload["model_config"])).to(device)
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return Checkpoint(model, Vocabulary(tuple(payload["vocabulary"])), payload["metadata"])


def load_training_state(path: Location) -> tuple[dict[str, Any], dict[str, Any]]:
    """The training state of a training checkpoint (on the CPU), and the metadata stored with it."""
    payload = _load(path, "cpu")
    if "training_state" not in payload:
        raise ValueError(f"checkpoint: {path} holds weights only, not a training state to resume from; "
                         f"resume from the run's latest checkpoint instead")
    return payload["training_state"], payload["metadata"]


def _load(path: Location, device: str | torch.device) -> dict[str, Any]:
    if not artifact_store.exists(path):
        raise FileNotFoundError(f"checkpoint: no file at {path}")
    with artifact_store.local_copy(path) as local:
        payload = torch.load(local, map_location=device, weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"checkpoint: {path} is not an lm-tuner checkpoint (expected format {FORMAT!r})")
    return payload
