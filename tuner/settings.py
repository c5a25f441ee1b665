"""Where studies are stored, with defaults a user can override by flag or environment variable."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

HOME_VARIABLE = "LM_TUNER_HOME"
STORAGE_VARIABLE = "LM_TUNER_STORAGE"
ARTIFACTS_VARIABLE = "LM_TUNER_ARTIFACTS"


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class SettingsError(ValueError):
    """A storage URL or folder that cannot be used; the message names the option."""


def home() -> Path:
    return Path(os.environ.get(HOME_VARIABLE, "lm-tuner-data")).absolute()


def default_storage() -> str:
    return os.environ.get(STORAGE_VARIABLE) or f"sqlite:///{home() / 'tuner.db'}"


class ObjectStoreUrl(str):
    """A folder (prefix) or file in object storage, by fsspec URL (s3://bucket/prefix): a string that joins,
    resolves and compares like a Path, without touching the store. Object stores have no links, so resolving
    only folds `.` and `..` (never above the bucket)."""

    def __new__(cls, url: str) -> ObjectStoreUrl:
        if not _SCHEME.match(url) or url.startswith("file://"):
            raise SettingsError(f"artifact store: got {url!r}, not an object-storage URL such as s3://bucket/prefix")
        return super().__new__(cls, url.rstrip("/"))

    def __truediv__(self, relative: str | Path) -> ObjectStoreUrl:
        return ObjectStoreUrl(f"{self}/{relative}")

    def resolve(self) -> ObjectStoreUrl:
        scheme, _, path = self.partition("://")
        return ObjectStoreUrl(f"{scheme}://{posixpath.normpath('/' + path).lstrip('/')}")

    def is_relative_to(self, other: str) -> bool:
        return self == other or self.startswith(other.rstrip("/") + "/")


ArtifactRoot = Path | ObjectStoreUrl


def artifact_root(location: str | Path) -> ArtifactRoot:
    """An artifact store from a flag, variable or stored value: an object-storage URL, else an absolute path
    (a file:// URL is a local path)."""
    if isinstance(location, str) and _SCHEME.match(location) and not location.startswith("file://"):
        return ObjectStoreUrl(location)
    return Path(str(location).removeprefix("file://")).absolute()


def default_artifacts() -> ArtifactRoot:
    return artifact_root(os.environ.get(ARTIFACTS_VARIABLE) or home() / "artifacts")


@dataclass(frozen=True)
class Settings:
    """Where one controller reads and writes: the database, the artifact store, the Ray cluster."""

    storage_url: str
    artifact_root: ArtifactRoot  # a local folder, or a prefix in object storage
    ray_address: str | None = None
    private_reads: bool = False  # API: reads need a token too (once tokens exist)

    @classmethod
    def from_options(cls, storage: str | None, artifacts: str | Path | None, ray_address: str | None = None,
                     private_reads: bool = False) -> Settings:
        url = storage or default_storage()
        _check_storage(url, "--storage" if storage else f"${STORAGE_VARIABLE}" if os.environ.get(STORAGE_VARIABLE)
                       else f"${HOME_VARIABLE}")
        return cls(url, artifact_root(artifacts) if artifacts else default_artifacts(), ray_address, private_reads)

    @property
    def ray_results(self) -> Path:
        """Ray Tune's own records (no checkpoint: trials write theirs to the artifact store themselves), on this
        machine's disk when the artifact store is object storage."""
        if isinstance(self.artifact_root, ObjectStoreUrl):
            return home() / "_ray"
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
