"""`tuner data fetch NAME --from ARCHIVE_OR_DIR`: a registered dataset imported from a copy downloaded elsewhere,
checked against the registry's digests; a failed fetch or import leaves nothing behind; the download error says, once,
what the dataset needs and how to import it. The real PTB files are a test fixture here, never read by the project."""

from __future__ import annotations

import dataclasses
import io
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from lm_tuner.trainers import RegisteredDatasetConfig
from lm_tuner.trainers.cache_install import staging_folder
from lm_tuner.trainers.checksums import CHECKSUMS, read_checksums
from lm_tuner.trainers.files import CACHE_VARIABLE, sha256_of
from lm_tuner.trainers.offline_copy import import_dataset
from lm_tuner.trainers.registry import REGISTRY, RegisteredDataset, how_to_get, is_fetched
from lm_tuner.tuner.cli.app import app
from lm_tuner.tuner.run.controller import StudyRefused, prepared_corpus
from lm_tuner.tuner.run.study_data import DatasetUnavailable, vocabulary_size
from lm_tuner.tuner.spec import StudySpec
from tests.conftest import TINY_SPEC

SHARED_PTB = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "ptb"
PTB_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")
PTB_STUDY = StudySpec.model_validate({**TINY_SPEC, "dataset": {"name": "ptb"}, "parameter_budget": 100_000})
needs_ptb = pytest.mark.skipif(not SHARED_PTB.is_dir(), reason=f"no PTB files at {SHARED_PTB}")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The dataset cache of the test ($LM_TUNER_DATA), not made yet."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_VARIABLE, str(folder))
    return folder


@pytest.fixture
def offline_ptb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> RegisteredDataset:
    """The registered PTB; every registered archive's address is made unreachable (a file that does not exist), so
    that no test here downloads, whatever network the machine has."""
    for name, dataset in REGISTRY.items():
        monkeypatch.setitem(REGISTRY, name, dataclasses.replace(
            dataset, url=(tmp_path / "nowhere" / dataset.archive_name).as_uri()))
    return REGISTRY["ptb"]


def fetch(*args: str) -> Result:
    return CliRunner().invoke(app, ["data", "fetch", *args])


def tar_of(path: Path, members: dict[str, Path | bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, content in members.items():
            data = content if isinstance(content, bytes) else content.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def assert_ptb_in(cache: Path) -> None:
    recorded = read_checksums(cache / "ptb" / CHECKSUMS)
    for name in PTB_FILES:
        assert recorded[name] == REGISTRY["ptb"].sha256[name] == sha256_of(cache / "ptb" / name)


@needs_ptb
def test_the_archive_downloaded_elsewhere_is_imported_with_the_pinned_digests_checked(tmp_path, cache, offline_ptb):
    archive = tar_of(tmp_path / "simple-examples.tgz",
                     {f"simple-examples/data/{name}": SHARED_PTB / name for name in PTB_FILES})
    result = fetch("ptb", "--from", str(archive))
    assert result.exit_code == 0, result.output
    assert f"{cache / 'ptb'} (imported from {archive})" in result.stdout
    for name in PTB_FILES:
        assert f"{REGISTRY['ptb'].sha256[name]}  {name}  (" in result.stdout
    assert result.stdout.count("pinned in the registry") == 3
    assert_ptb_in(cache)
    assert read_checksums(cache / "ptb" / CHECKSUMS)["simple-examples.tgz"] == sha256_of(archive)
    assert sorted(path.name for path in cache.iterdir()) == ["ptb"]  # no staging folder left
    assert fetch("ptb").exit_code == 0  # in place: no download is tried


@needs_ptb
@pytest.mark.parametrize("layout", ["flat", "the archive's folders", "the extracted simple-examples folder"])
def test_a_folder_of_the_files_is_imported_laid_flat_or_in_the_archive_layout(tmp_path, cache, offline_ptb, layout):
    source = tmp_path / "copy"
    inner = {"flat": source, "the archive's folders": source / "simple-examples" / "data",
             "the extracted simple-examples folder": source / "data"}[layout]
    inner.mkdir(parents=True)
    for name in PTB_FILES:
        shutil.copyfile(SHARED_PTB / name, inner / name)
    result = fetch("ptb", "--from", str(source))
    assert result.exit_code == 0, result.output
    assert_ptb_in(cache)


@needs_ptb
def test_a_folder_with_its_own_checksums_is_imported_after_checking_them(cache, offline_ptb):
    assert (SHARED_PTB / CHECKSUMS).is_file()
    assert fetch("ptb", "--from", str(SHARED_PTB)).exit_code == 0
    assert_ptb_in(cache)


@needs_ptb
def test_a_copy_whose_file_differs_from_the_pinned_digest_is_refused_and_leaves_nothing(tmp_path, cache, offline_ptb):
    changed = (SHARED_PTB / "ptb.valid.txt").read_bytes().replace(b"the", b"a", 1)
    archive = tar_of(tmp_path / "simple-examples.tgz", {
        "simple-examples/data/ptb.train.txt": SHARED_PTB / "ptb.train.txt",
        "simple-examples/data/ptb.valid.txt": changed,
        "simple-examples/data/ptb.test.txt": SHARED_PTB / "ptb.test.txt"})
    result = fetch("ptb", "--from", str(archive))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: simple-examples/data/ptb.valid.txt in {archive} (as simple-examples.tgz "
                                    f"from {offline_ptb.url}): SHA-256 is ")
    assert f"expected {REGISTRY['ptb'].sha256['ptb.valid.txt']} (pinned in the dataset registry)" in result.stderr
    assert not cache.exists()


def test_a_folder_whose_checksums_file_disagrees_is_refused(tmp_path, cache):
    dataset = tiny_dataset(tmp_path)
    source = tmp_path / "copy"
    source.mkdir()
    for name in PTB_FILES:
        (source / name).write_text(f"{name} words\n")
    (source / CHECKSUMS).write_text(f"{'0' * 64}  ptb.test.txt\n")
    with pytest.raises(ValueError, match=rf"^{source / 'ptb.test.txt'}: SHA-256 is [0-9a-f]{{64}}, expected 0{{64}} "
                                         rf"\(recorded in {source / CHECKSUMS}\)"):
        import_dataset(dataset, source, cache)
    assert not cache.exists()


def test_a_folder_missing_a_file_names_it_where_it_looked_and_the_layout(tmp_path, cache, offline_ptb):
    source = tmp_path / "copy"
    (source / "simple-examples" / "data").mkdir(parents=True)
    for name in ("ptb.train.txt", "ptb.valid.txt"):
        (source / "simple-examples" / "data" / name).write_text("a b\n")
    result = fetch("ptb", "--from", str(source))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: dataset 'ptb': --from {source}: no ptb.test.txt in the folder, nor in its "
                                    f"folders data/ or simple-examples/data/; to import a copy downloaded elsewhere, "
                                    f"`tuner data fetch ptb --from simple-examples.tgz`")
    assert result.stderr.count("\n") == 1
    assert not cache.exists()


def test_a_file_that_is_no_archive_is_refused(tmp_path, cache, offline_ptb):
    notes = tmp_path / "ptb.train.txt"
    notes.write_text("a b\n")
    result = fetch("ptb", "--from", str(notes))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: dataset 'ptb': --from {notes}: not a zip or tar archive; ")
    assert fetch("ptb", "--from", str(tmp_path / "absent.tgz")).stderr.startswith(
        f"error: dataset 'ptb': --from {tmp_path / 'absent.tgz'}: no such file or folder; ")
    assert not cache.exists()


def test_a_pinned_archive_is_checked_before_anything_is_extracted_and_its_one_file_may_come_alone(tmp_path, cache):
    archive = tmp_path / "one.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("one", "0123456789" * 10)
    dataset = RegisteredDataset("one", "http://example.invalid/one.zip", "enwik8", {"one": "one"}, "one file",
                                archive_sha256="0" * 64)
    with pytest.raises(ValueError, match=rf"^{archive} \(as one.zip from http://example.invalid/one.zip\): SHA-256 is "
                                         rf"{sha256_of(archive)}, expected 0{{64}} \(pinned in the dataset registry\)"):
        import_dataset(dataset, archive, cache)
    assert not cache.exists()
    pinned = dataclasses.replace(dataset, archive_sha256=sha256_of(archive))
    assert read_checksums(import_dataset(pinned, archive, cache) / CHECKSUMS)["one.zip"] == sha256_of(archive)
    alone = tmp_path / "alone" / "one"
    alone.parent.mkdir()
    alone.write_text("another text")
    assert (import_dataset(pinned, alone, cache) / "one").read_text() == "another text"  # nothing pinned for the file


def test_the_download_error_names_the_dataset_once_with_its_files_layout_and_the_import(cache, offline_ptb):
    with pytest.raises(StudyRefused) as refused:
        prepared_corpus(PTB_STUDY)
    message = str(refused.value)
    assert message == (f"dataset 'ptb': could not download {offline_ptb.url} (No such file or directory); check the "
                       f"network, or to import a copy downloaded elsewhere, `tuner data fetch ptb --from "
                       f"simple-examples.tgz` (the archive at {offline_ptb.url}) or `tuner data fetch ptb --from DIR` "
                       f"with DIR holding ptb.train.txt, ptb.valid.txt and ptb.test.txt laid flat or in the archive's "
                       f"folders (simple-examples/data/)")
    with pytest.raises(DatasetUnavailable) as unavailable:  # what plan says where it needs the files
        vocabulary_size(PTB_STUDY.model_copy(update={"dataset": RegisteredDatasetConfig(name="wikitext-2")}))
    assert str(unavailable.value).startswith("dataset 'wikitext-2': could not download ")
    assert not cache.exists() and not is_fetched(offline_ptb)


def test_how_to_get_a_dataset_names_the_download_and_the_import():
    text = how_to_get(REGISTRY["wikitext-2"])
    assert text.startswith("`tuner data fetch wikitext-2` downloads it from https://wikitext.smerity.com/"
                           "wikitext-2-v1.zip; to import a copy downloaded elsewhere, `tuner data fetch wikitext-2 "
                           "--from wikitext-2-v1.zip`")
    assert text.endswith("with DIR holding wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens laid flat or in "
                         "the archive's folders (wikitext-2/)")
    assert how_to_get(REGISTRY["enwik8"]).endswith("with DIR holding enwik8 laid flat")


def test_the_cli_refuses_an_unknown_dataset_with_the_registered_names(cache):
    result = fetch("ptb2", "--from", "x.tgz")
    assert result.exit_code == 2 and "unknown name 'ptb2'; registered: ptb, ptb-char" in result.stderr


def tiny_dataset(tmp_path: Path) -> RegisteredDataset:
    return RegisteredDataset("tiny", (tmp_path / "tiny.tgz").as_uri(), "ptb",
                             {name: f"data/{name}" for name in PTB_FILES}, "tiny")


def test_a_dataset_with_nothing_pinned_is_recorded_at_import(tmp_path, cache):
    source = tmp_path / "copy"
    source.mkdir()
    for name in PTB_FILES:
        (source / name).write_text(f"{name} words\n")
    folder = import_dataset(tiny_dataset(tmp_path), source, cache)
    assert read_checksums(folder / CHECKSUMS) == {name: sha256_of(source / name) for name in PTB_FILES}
    assert sorted(path.name for path in folder.iterdir()) == sorted([*PTB_FILES, CHECKSUMS])


def test_a_fetch_runs_while_another_of_the_same_dataset_is_under_way_in_this_process(tmp_path, cache):
    """The API plans in a thread pool: two requests may fetch one dataset at once, each in a staging folder of its
    own."""
    source = tmp_path / "copy"
    source.mkdir()
    for name in PTB_FILES:
        (source / name).write_text(f"{name} words\n")
    dataset = tiny_dataset(tmp_path)
    with staging_folder(cache / "tiny"):  # another thread's, under way
        folder = import_dataset(dataset, source, cache)
    assert is_fetched(dataset, cache) and folder == cache / "tiny"
    assert sorted(path.name for path in cache.iterdir()) == ["tiny"]
