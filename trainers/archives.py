"""Extracting chosen members of a downloaded zip or tar archive into a folder.

Each member is written under its own file name through a temporary file, so a folder never holds
a half-written file, and its SHA-256 is computed on the way for the dataset's checksum record.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import zipfile
from pathlib import Path
from typing import IO


def extract_members(archive: Path, members: dict[str, str], folder: Path) -> dict[str, str]:
    """Write each wanted member to its file name in `folder`; returns their SHA-256 digests."""
    digests = {}
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as bundle:
            available = {info.filename.removeprefix("./"): info for info in bundle.infolist()}
            for name, member in members.items():
                _require_member(archive, member, available)
                with bundle.open(available[member]) as source:
                    digests[name] = _write_atomically(source, folder / name)
    else:
        with tarfile.open(archive) as bundle:
            available = {info.name.removeprefix("./"): info for info in bundle.getmembers() if info.isfile()}
            for name, member in members.items():
                _require_member(archive, member, available)
                digests[name] = _write_atomically(bundle.extractfile(available[member]), folder / name)
    return digests


def _require_member(archive: Path, member: str, available: dict) -> None:
    if member not in available:
        raise ValueError(f"{archive.name}: the archive has no member {member!r}; it is not the expected archive "
                         f"(members include {sorted(available)[:5]})")


def _write_atomically(source: IO[bytes], target: Path) -> str:
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    digest = hashlib.sha256()
    with temporary.open("wb") as handle:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
            handle.write(block)
    os.replace(temporary, target)
    return digest.hexdigest()
