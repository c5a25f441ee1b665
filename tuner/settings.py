"""Where studies are stored, with defaults a user can override by flag or environment variable."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOME_VARIABLE = "LM_TUNER_HOME"
STORAGE_VARIABLE = "LM_TUNER_STORAGE"
ARTIFACTS_VARIABLE = "LM_TUNER_ARTIFACTS"


def home() -> Path:
    return Path(os.environ.get(HOME_VARIABLE, "lm-tuner-data")).absolute()


def default_storage() -> str:
    return os.environ.get(STORAGE_VARIABLE) or f"sqlite:///{home() / 'tuner.db'}"


def default_artifacts() -> Path:
    return Path(os.environ.get(ARTIFACTS_VARIABLE) or home() / "artifacts").absolute()


@dataclass(frozen=True)
class Settings:
    """Where one controller reads and writes: the database, the artifact store, the Ray cluster."""

    storage_url: str
    artifact_root: Path
    ray_address: str | None = None
    private_reads: bool = False  # API: reads need a token too (once tokens exist)

    @classmethod
    def from_options(cls, storage: str | None, artifacts: Path | None, ray_address: str | None = None,
                     private_reads: bool = False) -> Settings:
        return cls(storage or default_storage(), (artifacts or default_artifacts()).absolute(), ray_address,
                   private_reads)

    @property
    def ray_results(self) -> Path:
        return self.artifact_root / "_ray"
