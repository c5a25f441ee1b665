"""Where studies are stored, with defaults a user can override by flag or environment variable."""

from __future__ import annotations

import logging
import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

HOME_VARIABLE = "LM_TUNER_HOME"
STORAGE_VARIABLE = "LM_TUNER_STORAGE"
ARTIFACTS_VARIABLE = "LM_TUNER_ARTIFACTS"
ALLOWED_HOSTS_VARIABLE = "LM_TUNER_ALLOWED_HOSTS"  # `tuner serve --allowed-host`, names separated by commas
DATA_FOLDERS_VARIABLE = "LM_TUNER_DATA_FOLDERS"  # `tuner serve --data-folder`, folders separated by colons


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class SettingsError(ValueError):
    """A storage URL or folder that cannot be used; the message names the option."""


RAY_IDLE_SECONDS = 10.0
"""How long both queues stay empty before a worker shuts down the Ray it started (a study submitted meanwhile reuses
it; a stop that comes as a study ends does not land in the shutdown); `tuner worker --ray-idle-seconds`."""
EARLIER_HOME = Path("lm-tuner-data")  # the default of versions up to 0.1, in the working folder

log = logging.getLogger(__name__)


def home() -> Path:
    """Where the default database and artifacts live: $LM_TUNER_HOME, else this user's data folder (on Linux
    $XDG_DATA_HOME/lm-tuner, by default ~/.local/share/lm-tuner), the same from any working folder: a launch in one
    folder and `tuner serve` in another share one database."""
    configured = os.environ.get(HOME_VARIABLE)
    if configured:
        return Path(configured).absolute()
    import platformdirs

    return Path(platformdirs.user_data_dir("lm-tuner", appauthor=False))


def default_storage() -> str:
    return os.environ.get(STORAGE_VARIABLE) or f"sqlite:///{home() / 'tuner.db'}"


class ObjectStoreUrl(str):
    """A folder (prefix) or file in object storage, by fsspec URL (s3://bucket/prefix): a string that joins,
    resolves and compares like a Path, without touching the store. Object stores have no links, so resolving
    only folds `.` and `..` (never above the bucket)."""

    def __new__(cls, url: str) -> ObjectStoreUrl:
        if not _SCHEME.match(url) or url.startswith("file://"):
            raise SettingsError(f"artifact store: got {masked_url(url)!r}, not an object-storage URL such as "
                                f"s3://bucket/prefix")
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
    allowed_hosts: tuple[str, ...] = ()  # API: Host names answered beyond the loopback names ("*": any)
    data_folders: tuple[Path, ...] = ()  # API: the only folders a submitted spec may read data from (empty: any)

    @classmethod
    def from_options(cls, storage: str | None, artifacts: str | Path | None, ray_address: str | None = None,
                     private_reads: bool = False) -> Settings:
        url = storage or default_storage()
        if storage is None and not os.environ.get(STORAGE_VARIABLE):
            _notice_earlier_database(url)
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

    def __post_init__(self) -> None:  # what Ray pickles of the URL holds no password (PrivateUrl)
        object.__setattr__(self, "storage_url", PrivateUrl(self.storage_url))


def _notice_earlier_database(url: str) -> None:
    """One line, once, where the working folder holds the default database of earlier versions and `url`, the default
    now, is another: their studies are not lost, only no longer found without being asked for."""
    earlier = (EARLIER_HOME / "tuner.db").absolute()
    if earlier.is_file() and url != f"sqlite:///{earlier}" and not _noticed:
        _noticed.append(earlier)
        log.warning(f"note: {earlier} (the default database of earlier versions) is not used; the default is now "
                    f"{home() / 'tuner.db'}. To go on with it, set {HOME_VARIABLE}={earlier.parent}, or move that "
                    f"folder to {home()}")


_noticed: list[Path] = []


def _check_storage(url: str, option: str) -> None:
    """A URL SQLAlchemy can parse, of a database it has a driver for."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as error:
        shown = masked_url(url)
        raise SettingsError(f"{option}: got {shown!r}, not a database URL this installation can use "
                            f"({str(error).replace(url, shown)}); e.g. sqlite:///path/tuner.db or "
                            f"postgresql://user@host/db") from error


MASK = "***"  # as SQLAlchemy's render_as_string(hide_password=True) writes a password
# user:password@ up to the last @ (a password with an unescaped @ is hidden whole), after the scheme and a user name
_PASSWORD = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*:)(?P<password>.*)@(?P<tail>[^@]*)$", re.DOTALL)
# query parameters that carry a secret: libpq's password=, object stores' secret keys, tokens and signatures
_SECRET_PARAMETER = re.compile(r"pass|secret|token|signature|credential|key$", re.IGNORECASE)


def masked_url(url: str | Path) -> str:
    """`url` as every message, log line and output shows it: a password in it (`user:password@`, or a query
    parameter such as `password=`, an object store's secret key or a signature) written `***`. Anything that is not
    a URL with a secret (a path, a URL without a password, text that does not parse) is shown as it is."""
    text = str(url)
    if found := _PASSWORD.match(text):
        text = f"{found['head']}{MASK}@{found['tail']}"
    head, mark, query = text.partition("?")
    if not mark:
        return text
    return head + mark + "&".join(_masked_parameter(parameter) for parameter in query.split("&"))


def _masked_parameter(parameter: str) -> str:
    name, equals, _ = parameter.partition("=")
    return f"{name}={MASK}" if equals and _SECRET_PARAMETER.search(name) else parameter


class PrivateUrl(str):
    """A URL that may hold a password, pickled without it. Ray Tune pickles what holds the storage URL (searchers,
    callbacks, the stopper, Optuna's storage) into files under the artifact store's `_ray` folder and its own
    temporary folder: the pickle holds the masked URL, and unpickling finds the whole URL again among those this
    process was given, else in ${STORAGE_VARIABLE} where it masks to the same text."""

    _whole: ClassVar[dict[str, str]] = {}  # masked URL -> the URL, of every PrivateUrl made in this process

    def __new__(cls, url: str) -> PrivateUrl:
        made = super().__new__(cls, url)
        cls._whole[masked_url(made)] = str(made)
        return made

    def __reduce__(self) -> tuple[Callable[[str], PrivateUrl], tuple[str]]:
        return _unpickled_url, (masked_url(self),)


def _unpickled_url(masked: str) -> PrivateUrl:
    whole = PrivateUrl._whole.get(masked)
    given = os.environ.get(STORAGE_VARIABLE)
    if whole is None and given and masked_url(given) == masked:
        whole = given
    if whole is None and MASK in masked:
        raise SettingsError(f"{masked} was saved without its password, and this process was not given the URL; set "
                            f"${STORAGE_VARIABLE} to it")
    return PrivateUrl(whole or masked)
