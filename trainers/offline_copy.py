"""Importing a registered dataset downloaded on another machine (`tuner data fetch NAME --from ...`).

The copy is the registry's archive (any file name), or a folder holding the dataset's files laid flat or in the
archive's folders. It is verified as a download is: a pinned archive before anything is read from it, pinned files
before they enter the cache, files a folder's own SHA256SUMS records against it; the rest are recorded (trusted on
first use, as a download of them would be).
"""

from __future__ import annotations

import shutil
import tarfile
import zipfile
from pathlib import Path

from lm_tuner.trainers.cache_install import UnwritableCache, install_archive, install_files, staging_folder
from lm_tuner.trainers.checksums import CHECKSUMS, verify_checksums
from lm_tuner.trainers.files import sha256_of
from lm_tuner.trainers.registry import (
    DatasetNotFetched,
    RegisteredDataset,
    dataset_folder,
    fetch_dataset,
    offline_copy,
    unwritable,
)


def import_dataset(dataset: RegisteredDataset, source: Path, cache_dir: Path | None = None) -> Path:
    """Put the dataset's files from `source` (its archive, or a folder of its files) into the cache, verified;
    returns the dataset's folder. DatasetNotFetched where `source` is not a copy of it, ValueError where a file
    differs from its digest; either way the cache is as it was."""
    source = source.expanduser()
    folder = dataset_folder(dataset, cache_dir)
    remedy = f"import {dataset.archive_name} as {dataset.url} serves it, or its files unchanged"
    try:
        with staging_folder(folder) as staging:
            if is_archive(source):
                install_archive(dataset, source, staging, folder, remedy=remedy,
                                described=f"{source} (as {dataset.archive_name} from {dataset.url})")
            else:
                origins = _copy_files(dataset, source, staging, cache_dir)
                install_files(dataset, staging, folder, {name: sha256_of(staging / name) for name in dataset.members},
                              origins, remedy=remedy)
    except UnwritableCache as error:
        raise unwritable(dataset, error) from error
    return fetch_dataset(dataset, cache_dir)  # verified in place, as every later read verifies it


def _copy_files(dataset: RegisteredDataset, source: Path, staging: Path, cache_dir: Path | None) -> dict[str, str]:
    """Copy the dataset's files from a folder, or its one file given by itself (enwik8, text8), into `staging`;
    returns the path each was copied from."""
    if source.is_dir():
        return _gather(dataset, source, staging, cache_dir)
    if source.is_file() and list(dataset.members) == [source.name]:
        shutil.copyfile(source, staging / source.name)
        return {source.name: str(source)}
    raise DatasetNotFetched(dataset.name, f"--from {source}: {_not_a_copy(source)}; {offline_copy(dataset, cache_dir)}")


def _gather(dataset: RegisteredDataset, source: Path, staging: Path, cache_dir: Path | None) -> dict[str, str]:
    """Copy each file of the dataset from the folder `source` into `staging`, checked against the SHA256SUMS beside it
    where there is one. A file is looked for at its path in the archive and at each shorter tail of that path, down to
    its bare name."""
    found, subfolders = {}, set()
    for name, member in dataset.members.items():
        parts = member.split("/")
        subfolders |= {"/".join(parts[start:-1]) + "/" for start in range(len(parts) - 1)}
        places = (source.joinpath(*parts[start:]) for start in range(len(parts)))
        found[name] = next((place for place in places if place.is_file()), None)
    missing = [name for name, path in found.items() if path is None]
    if missing:
        nor = f", nor in its folder{'s' if len(subfolders) > 1 else ''} {' or '.join(sorted(subfolders))}" \
            if subfolders else ""
        raise DatasetNotFetched(dataset.name, f"--from {source}: no {' or '.join(missing)} in the folder{nor}; "
                                              f"{offline_copy(dataset, cache_dir)}")
    for folder in {path.parent for path in found.values()}:
        if (folder / CHECKSUMS).is_file():
            verify_checksums(folder, [path.name for path in found.values() if path.parent == folder], pinned={},
                             remedy=f"copy the file again, or fix {folder / CHECKSUMS}", record=False)
    for name, path in found.items():
        shutil.copyfile(path, staging / name)
    return {name: str(path) for name, path in found.items()}


def is_archive(path: Path) -> bool:
    return path.is_file() and (zipfile.is_zipfile(path) or tarfile.is_tarfile(path))


def _not_a_copy(source: Path) -> str:
    if not source.exists():
        return "no such file or folder"
    return "not a zip or tar archive" if source.is_file() else "not a file or a folder"
