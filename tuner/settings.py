"""Where studies are stored, with defaults a user can override by flag or environment variable."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HOME_VARIABLE = "LM_TUNER_HOME"
STORAGE_VARIABLE = "LM_TUNER_STORAGE"
ARTIFACTS_VARIABLE = "LM_TUNER_ARTIFACTS"


class SettingsError(ValueError):
    """A storage URL or folder that cannot be used; the message names the option."""


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
        url = storage or default_storage()
        _check_storage(url, "--storage" if storage else f"${STORAGE_VARIABLE}" if os.environ.get(STORAGE_VARIABLE)
                       else f"${HOME_VARIABLE}")
        return cls(url, (artifacts or default_artifacts()).absolute(), ray_address, private_reads)

    @property
    def ray_results(self) -> Path:
        return self.artifact_root / "_ray"


def _check_storage(url: str, option: str) -> None:
    """A URL SQLAlchemy can parse, of a database it has a driver for."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as error:
        raise SettingsError(f"{option}: got {url!r}, not a database URL this installation can use ({error}); "
                            f"e.g. sqlite:///path/tuner.db or postgresql://user@host/db") from error
