"""The SHA256SUMS record of a dataset folder: reading it, writing it, and checking files against it.

The dataset registry pins a SHA-256 where one is known for certain: computed by this project from the
file itself, or published for exactly the archive's URL (each digest's source is cited there). A
pinned archive is verified before anything is extracted from it, so the digests of its members,
recorded in the dataset's `SHA256SUMS` at that moment, descend from a verified file. A download with
nothing pinned is trusted at first use: the same record is written, and every later load verifies the
files against it. A folder given by `path:` is verified against its own `SHA256SUMS` when it has one.
A mismatch is an error naming the file and both digests.
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
        check_digest(folder / name, sha256_of(folder / name), expected, source, remedy)
    unrecorded = [name for name in names if name not in recorded]
    if record and unrecorded:
        write_checksums(folder / CHECKSUMS, recorded | {name: sha256_of(folder / name) for name in unrecorded})


def check_digest(file: Path | str, actual: str, expected: str, source: str, remedy: str) -> None:
    """Raises the error naming `file`, its SHA-256 and the one expected (and where that comes from) when they differ."""
    if actual != expected:
        raise ValueError(f"{file}: SHA-256 is {actual}, expected {expected} ({source}); the file is corrupt or a "
                         f"different version: {remedy}")


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
