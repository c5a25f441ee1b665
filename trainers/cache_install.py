"""Putting a registered dataset's files into its cache folder all at once, from an archive or from files.

The files are gathered and checked against the registry's pinned digests in a staging folder beside the dataset's
folder (the same filesystem), then moved in and recorded in its SHA256SUMS. A download or an import that fails at any
point leaves nothing behind: no dataset folder, no half-written file, no record, and no cache folder made for it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from lm_tuner.trainers.archives import extract_members
from lm_tuner.trainers.checksums import CHECKSUMS, check_digest, read_checksums, write_checksums
from lm_tuner.trainers.files import sha256_of

if TYPE_CHECKING:
    from lm_tuner.trainers.registry import RegisteredDataset


class UnwritableCache(OSError):
    """The staging folder cannot be made where the dataset's folder would be."""


@contextmanager
def staging_folder(folder: Path) -> Iterator[Path]:
    """A new, empty folder beside `folder`, removed when the block ends; on an error, so are the folders above it
    that were made for it and are still empty. UnwritableCache where it cannot be made."""
    made = [parent for parent in (folder.parent, *folder.parent.parents) if not parent.exists()]
    try:
        if made:
            folder.parent.mkdir(parents=True)
        # a name of its own: two threads of one process (the API's) may fetch the same dataset at once
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    except OSError as error:
        raise UnwritableCache(error.errno, error.strerror, str(folder)) from error
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in made:  # innermost first; one that holds something by now (another dataset) stays
            try:
                parent.rmdir()
            except OSError:
                break
        raise
    shutil.rmtree(staging, ignore_errors=True)


def install_archive(dataset: RegisteredDataset, archive: Path, staging: Path, folder: Path, *, described: str,
                    remedy: str) -> None:
    """Check `archive` (`described` so in errors) against the registry's pin, where there is one, before reading it;
    extract the dataset's members into `staging`, check them, then move them into `folder` with the archive's digest
    recorded."""
    digest = sha256_of(archive)
    if dataset.archive_sha256 is not None:  # nothing is extracted from an archive that is not the pinned one
        check_digest(described, digest, dataset.archive_sha256, "pinned in the dataset registry", remedy)
    extracted = extract_members(archive, dataset.members, staging)
    install_files(dataset, staging, folder, extracted, {name: f"{member} in {described}"
                                                        for name, member in dataset.members.items()},
                  archive_digest=digest, remedy=remedy)


def install_files(dataset: RegisteredDataset, staging: Path, folder: Path, digests: dict[str, str],
                  origins: dict[str, str], *, archive_digest: str | None = None, remedy: str) -> None:
    """Check the dataset's files in `staging` (their `digests`; each named in errors by its `origins`) against the
    registry's pins, then move them into `folder` and record their digests, and their archive's, in its SHA256SUMS."""
    for name, expected in dataset.sha256.items():
        check_digest(origins[name], digests[name], expected, "pinned in the dataset registry", remedy)
    folder.mkdir(exist_ok=True)
    for name in dataset.members:
        os.replace(staging / name, folder / name)
    archive = {} if archive_digest is None else {dataset.archive_name: archive_digest}
    write_checksums(folder / CHECKSUMS, read_checksums(folder / CHECKSUMS) | digests | archive)
