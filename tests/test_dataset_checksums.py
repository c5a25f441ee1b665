"""Pinned data: the registry's digests are well formed, a pinned archive is verified before anything is extracted,
and every mismatch names the file and both SHA-256 digests. Local fixtures only, no network."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from pathlib import Path

import pytest

from lm_tuner.trainers import LocalDatasetConfig, load_corpus
from lm_tuner.trainers.checksums import CHECKSUMS, read_checksums
from lm_tuner.trainers.files import sha256_of
from lm_tuner.trainers.registry import REGISTRY, RegisteredDataset, fetch_dataset

FILES = {"ptb.train.txt": b"a b\nb a\n", "ptb.valid.txt": b"a\n", "ptb.test.txt": b"b\n"}
DIGEST = re.compile(r"[0-9a-f]{64}")
WRONG = "0" * 64


def archive_of(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def tiny(archive: Path, **pins) -> RegisteredDataset:
    return RegisteredDataset("tiny", archive.as_uri(), "ptb", {name: f"data/{name}" for name in FILES}, "tiny", **pins)


def test_every_pinned_digest_is_a_sha256_of_a_file_the_dataset_has():
    for dataset in REGISTRY.values():
        assert set(dataset.sha256) <= set(dataset.members), dataset.name
        pins = [*dataset.sha256.values(), *([dataset.archive_sha256] if dataset.archive_sha256 else [])]
        assert all(DIGEST.fullmatch(digest) for digest in pins), dataset.name


def test_only_the_datasets_without_a_published_digest_are_unpinned():
    unpinned = {name for name, dataset in REGISTRY.items() if not dataset.sha256 and dataset.archive_sha256 is None}
    assert unpinned == {"ptb-char", "wikitext-2", "wikitext-103"}  # see the registry's comment for why


def test_a_pinned_archive_that_differs_is_refused_before_anything_is_extracted(tmp_path):
    archive = archive_of(tmp_path / "examples.tgz", {f"data/{name}": data for name, data in FILES.items()})
    with pytest.raises(ValueError) as refused:
        fetch_dataset(tiny(archive, archive_sha256=WRONG), tmp_path / "cache")
    message = str(refused.value)
    assert message.startswith(f"examples.tgz from {archive.as_uri()}: SHA-256 is {sha256_of(archive)}, "
                              f"expected {WRONG}")
    assert "pinned in the dataset registry" in message and "tuner data fetch tiny" in message
    assert not (tmp_path / "cache").exists()  # no folder, member, record or archive left behind


def test_a_pinned_archive_that_matches_is_extracted_and_recorded(tmp_path):
    archive = archive_of(tmp_path / "examples.tgz", {f"data/{name}": data for name, data in FILES.items()})
    folder = fetch_dataset(tiny(archive, archive_sha256=sha256_of(archive)), tmp_path / "cache")
    recorded = read_checksums(folder / CHECKSUMS)
    assert recorded["examples.tgz"] == sha256_of(archive)
    assert all(recorded[name] == sha256_of(folder / name) for name in FILES)


def test_a_pinned_file_that_differs_names_the_file_and_both_digests(tmp_path):
    archive = archive_of(tmp_path / "examples.tgz", {f"data/{name}": data for name, data in FILES.items()})
    with pytest.raises(ValueError) as refused:
        fetch_dataset(tiny(archive, sha256={"ptb.valid.txt": WRONG}), tmp_path / "cache")
    assert str(refused.value).startswith(f"data/ptb.valid.txt in examples.tgz from {archive.as_uri()}: SHA-256 is "
                                         f"{hashlib.sha256(FILES['ptb.valid.txt']).hexdigest()}, expected {WRONG} "
                                         f"(pinned in the dataset registry)")
    assert not (tmp_path / "cache").exists()


def test_a_recorded_file_that_changed_names_the_file_and_both_digests(tmp_path):
    archive = archive_of(tmp_path / "examples.tgz", {f"data/{name}": data for name, data in FILES.items()})
    folder = fetch_dataset(tiny(archive), tmp_path / "cache")
    recorded = read_checksums(folder / CHECKSUMS)["ptb.test.txt"]
    (folder / "ptb.test.txt").write_bytes(b"changed\n")
    with pytest.raises(ValueError) as refused:
        fetch_dataset(tiny(archive), tmp_path / "cache")
    assert str(refused.value).startswith(f"{folder / 'ptb.test.txt'}: SHA-256 is {sha256_of(folder / 'ptb.test.txt')}, "
                                         f"expected {recorded} (recorded in {folder / CHECKSUMS})")


def test_a_local_folder_whose_file_differs_from_its_record_names_the_file_and_both_digests(tmp_path):
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / CHECKSUMS).write_text(f"{WRONG}  ptb.train.txt\n")
    with pytest.raises(ValueError) as refused:
        load_corpus(LocalDatasetConfig(path=str(tmp_path), format="ptb"))
    train = tmp_path / "ptb.train.txt"
    assert str(refused.value).startswith(f"{train}: SHA-256 is {sha256_of(train)}, expected {WRONG}")
