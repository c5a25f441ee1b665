"""The SHA256SUMS record of a dataset folder: reading it, writing it, and checking files against it.

A registered file's SHA-256 is pinned in the dataset registry only where this project computed it
from the file itself (PTB word level, from the standard files). Every other download is checked on
trust at first use: the digests of the archive and of the extracted files are recorded in the
dataset's `SHA256SUMS` when it is fetched, and every later load verifies the files against that
record. A folder given by `path:` is verified against its own `SHA256SUMS` when it has one.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from lm_tuner.trainers.files import sha256_of

CHECKSUMS = "SHA256SUMS"


def verify_checksums(
    folder: Path, names: Collection[str], *, pinned: dict[str, str], remedy: str, record: bool = True
) -> None:
    """Check the files `names` of `folder` against `pinned` digests, else against the folder's SHA256SUMS.

    With `record`, files known to neither are recorded in SHA256SUMS now (trust on first use).
    """
    recorded = read_checksums(folder / CHECKSUMS)
    for name in names:
        expected, source = pinned.get(name), "pinned in the dataset registry"
        if expected is None:
            expected, source = recorded.get(name), f"recorded in {folder / CHECKSUMS}"
        if expected is None:
            continue
        actual = sha256_of(folder / name)
        if actual != expected:
            raise ValueError(f"{folder / name}: SHA-256 is {actual}, expected {expected} ({source}); the file is "
                             f"corrupt or a different version: {remedy}")
    unrecorded = [name for name in names if name not in recorded]
    if record and unrecorded:
        write_checksums(folder / CHECKSUMS, recorded | {name: sha256_of(folder / name) for name in unrecorded})


def read_checksums(path: Path) -> dict[str, str]:
    """`sha256sum`-style lines: digest, two spaces, file name."""
    if not path.is_file():
        return {}
    entries = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            digest, separator, name = line.partition("  ")
            if not separator or len(digest) != 64:
                raise ValueError(f"{path}:{number}: not a 'digest  name' line: {line!r}; fix or delete the file")
            entries[name.lstrip("*")] = digest
    return entries


def write_checksums(path: Path, entries: dict[str, str]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(entries.items())))
    os.replace(temporary, path)
