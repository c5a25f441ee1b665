"""Files in the artifact store, where it is a local folder or object storage (s3://bucket/prefix, or any other
fsspec URL): write atomically, test, size, hash, read and stream them by location.

A location is a local path, or a string holding a URL with a scheme (s3://, gs://, memory://, ...); file://
URLs are local paths. Object storage is reached through fsspec (s3fs for s3://), with credentials and endpoint
from the usual environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL for an
S3-compatible server such as MinIO), which botocore reads itself.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lm_tuner.trainers.files import sha256_of_chunks

Location = Path | str  # a local path, or a URL such as s3://bucket/key
CHUNK_BYTES = 1 << 20
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(location: Location) -> bool:
    """Whether `location` is in object storage (a URL other than file://) rather than on this machine's disk."""
    return isinstance(location, str) and bool(_SCHEME.match(location)) and not location.startswith("file://")


def local_path(location: Location) -> Path:
    """The local path a location names (a path, a path as text, or a file:// URL); not for object storage."""
    if is_url(location):
        raise ValueError(f"location: {location!r} is in object storage, not a local path")
    text = str(location)
    return Path(urlsplit(text).path) if text.startswith("file://") else Path(text)


def join(root: Location, relative: str) -> Location:
    """`relative` (a /-separated path) inside the folder or prefix `root`."""
    return f"{str(root).rstrip('/')}/{relative}" if is_url(root) else local_path(root) / relative


def exists(location: Location) -> bool:
    """Whether a file (an object) is at `location`."""
    if not is_url(location):
        return local_path(location).is_file()
    store, key = _store(location)
    store.invalidate_cache(key)  # another process (a Ray worker) may have written it since this one last looked
    return store.isfile(key)


def size(location: Location) -> int:
    if not is_url(location):
        return local_path(location).stat().st_size
    store, key = _store(location)
    store.invalidate_cache(key)
    return int(store.size(key))


def sha256(location: Location) -> str:
    return sha256_of_chunks(chunks(location))


def chunks(location: Location, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The file's bytes, `chunk_bytes` at a time (for hashing and streaming without holding it whole)."""
    opened = local_path(location).open("rb") if not is_url(location) else _open_object(location)
    with opened as handle:
        yield from iter(lambda: handle.read(chunk_bytes), b"")


@dataclass(frozen=True)
class StoredFile:
    """What was written: the file's SHA-256 (hex) and size in bytes."""

    sha256: str
    size: int


class StoreWriteError(OSError):
    """A file could not be written to the artifact store, through no fault of what was written: the store is full,
    read-only or not this process's to write (its errno says which). The message names the cause and the location,
    e.g. "artifact store: no space left on device writing /data/artifacts/s/lstm/trial-00003/latest.pt"."""

    def __init__(self, error: OSError, location: Location) -> None:
        super().__init__(error.errno, error.strerror or str(error), str(location))

    def __str__(self) -> str:
        cause = os.strerror(self.errno).lower() if self.errno else self.strerror
        return f"{STORE_FAULT}{cause} writing {self.filename}"


STORE_FAULT = "artifact store: "
"""How a StoreWriteError's message begins: a failure reason that the store caused, not the trial."""


def write_atomically(location: Location, write: Callable[[Path], None]) -> StoredFile:
    """Call `write` with a local temporary path, then put what it wrote at `location` in one step, so that a
    process killed at any moment leaves the old file or the new one, never half of one: on disk a rename, in
    object storage a single upload of the finished file (an object appears only once its upload completes).
    Returns the file's hash and size, taken from the local file before it is put in place: an object need not be
    downloaded again to know them. A write the store refuses (full, read-only, not permitted) raises
    StoreWriteError, naming the cause and the location; the file that was there stays, and no half-written
    temporary file is left to fill the store further."""
    if not is_url(location):
        path = local_path(location)
        temporary = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write(temporary)
            stored = _described(temporary)
            os.replace(temporary, path)
        except BaseException as error:
            with suppress(OSError):
                temporary.unlink(missing_ok=True)
            if isinstance(error, OSError):
                raise StoreWriteError(error, path) from error
            raise
        return stored
    store, key = _store(location)
    with tempfile.TemporaryDirectory(prefix="lm-tuner-upload-") as folder:
        temporary = Path(folder) / Path(key).name
        try:
            write(temporary)
        except OSError as error:  # this machine's temporary folder, where the object is made before its upload
            raise StoreWriteError(error, temporary) from error
        stored = _described(temporary)
        try:
            store.put_file(str(temporary), key)
        except OSError as error:
            raise StoreWriteError(error, location) from error
    store.invalidate_cache(key)
    return stored


def _described(path: Path) -> StoredFile:
    return StoredFile(sha256(path), path.stat().st_size)


@contextmanager
def local_copy(location: Location) -> Iterator[Path]:
    """A local path holding the file: the file itself on disk, a temporary download of an object (removed on
    exit)."""
    if not is_url(location):
        yield local_path(location)
        return
    store, key = _store(location)
    with tempfile.TemporaryDirectory(prefix="lm-tuner-download-") as folder:
        copy = Path(folder) / Path(key).name
        store.get_file(key, str(copy))
        yield copy


def holds_files(location: Location) -> bool:
    """Whether any file is in the folder `location` (below it too), or any object under the URL prefix."""
    if not is_url(location):
        return any(entry.is_file() for entry in local_path(location).rglob("*"))
    store, key = _store(str(location))
    store.invalidate_cache(key)
    return bool(store.find(key))


def remove_tree(location: Location) -> None:
    """Remove a folder and everything in it, or every object under a URL prefix; nothing there is not an error,
    a file that cannot be removed is (OSError)."""
    if not is_url(location):
        with suppress(FileNotFoundError):
            shutil.rmtree(local_path(location))
        return
    store, key = _store(str(location))
    if store.exists(key):
        store.rm(key, recursive=True)


def _open_object(location: str) -> Any:
    store, key = _store(location)
    return store.open(key, "rb")


def _store(location: str) -> tuple[Any, str]:
    """The fsspec filesystem serving the URL, and the object's path in it."""
    import fsspec  # imported on first use: a local artifact store never needs it

    store, key = fsspec.core.url_to_fs(location)
    return store, key
