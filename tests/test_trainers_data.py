"""Datasets: local files, the registry and its cache, generated corpora, batching."""

from __future__ import annotations

import io
import math
import tarfile
import typing
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from lm_tuner.trainers import (
    EOS,
    LocalDatasetConfig,
    MarkovCorpusConfig,
    ReverseCopyConfig,
    TextDatasetConfig,
    dataset_from_dict,
    load_corpus,
)
from lm_tuner.trainers.batching import TrainingStream, batchify, windows
from lm_tuner.trainers.checksums import CHECKSUMS, read_checksums
from lm_tuner.trainers.datasets import FormatName, RegisteredName, local_corpus
from lm_tuner.trainers.files import sha256_of
from lm_tuner.trainers.registry import LAYOUTS, REGISTRY, TEXT_LAYOUTS, Layout, RegisteredDataset, fetch_dataset
from lm_tuner.trainers.text import TextSource, read_corpus

SHARED_PTB = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "ptb"


def write_ptb(folder: Path, train: str = "a b c\nb c a\n", valid: str = "a c\n", test: str = "c b\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        (folder / f"ptb.{split}.txt").write_text(text)
    return folder


def test_ptb_format_reads_words_with_eos_per_line(tmp_path: Path) -> None:
    corpus = local_corpus(LocalDatasetConfig(path=str(write_ptb(tmp_path)), format="ptb"))
    assert corpus.vocabulary.tokens == ("a", "b", "c", EOS)
    assert corpus.train.tolist() == [0, 1, 2, 3, 1, 2, 0, 3]
    assert corpus.valid.tolist() == [0, 2, 3]
    assert corpus.test.tolist() == [2, 1, 3]


def test_unknown_tokens_fail_with_the_policies_to_choose_from(tmp_path: Path) -> None:
    folder = write_ptb(tmp_path, valid="a zebra\n")
    with pytest.raises(ValueError, match=r"split 'valid'.*'zebra'.*unknown_tokens: unk.*unknown_tokens: add"):
        local_corpus(LocalDatasetConfig(path=str(folder), format="ptb"))
    mapped = local_corpus(LocalDatasetConfig(path=str(folder), format="ptb", unknown_tokens="unk"))
    assert mapped.vocabulary.tokens[-1] == "<unk>"
    assert mapped.valid.tolist() == [0, len(mapped.vocabulary) - 1, 3]
    added = local_corpus(LocalDatasetConfig(path=str(folder), format="ptb", unknown_tokens="add"))
    assert "zebra" in added.vocabulary.tokens


def test_unknown_token_policy_must_be_one_of_three() -> None:
    with pytest.raises(ValidationError, match="'error', 'unk' or 'add'"):
        dataset_from_dict({"path": "/data", "format": "ptb", "unknown_tokens": "ignore"})


def test_empty_split_and_missing_file_say_which_file(tmp_path: Path) -> None:
    folder = write_ptb(tmp_path / "empty", test="\n\n")
    with pytest.raises(ValueError, match=r"split 'test' \(.*ptb\.test\.txt\) is empty"):
        local_corpus(LocalDatasetConfig(path=str(folder), format="ptb"))
    folder = write_ptb(tmp_path / "missing")
    (folder / "ptb.valid.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"split 'valid' has no file at .*ptb\.valid\.txt"):
        local_corpus(LocalDatasetConfig(path=str(folder), format="ptb"))
    with pytest.raises(FileNotFoundError, match="no folder at .*nowhere.*ptb.train.txt"):
        local_corpus(LocalDatasetConfig(path=str(tmp_path / "nowhere"), format="ptb"))


def test_the_error_policy_refuses_unknown_tokens_even_where_train_has_a_literal_unk(tmp_path: Path) -> None:
    folder = write_ptb(tmp_path, train="a <unk> b\n", valid="zebra\n")
    with pytest.raises(ValueError, match="'zebra'"):
        local_corpus(LocalDatasetConfig(path=str(folder), format="ptb"))


def write_text(folder: Path, train: str, valid: str, test: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        (folder / f"{split}.txt").write_bytes(text.encode("utf-8"))
    return folder


def test_text_format_by_word_keeps_words_seen_min_count_times(tmp_path: Path) -> None:
    folder = write_text(tmp_path, train="a b a\nc a b", valid="a z\n", test="\nb b\n")
    corpus = load_corpus(TextDatasetConfig(path=str(folder), format="text", min_count=2))
    assert corpus.vocabulary.tokens == ("a", "b", EOS, "<unk>")  # c occurs once
    assert corpus.train.tolist() == [0, 1, 0, 2, 3, 0, 1, 2]  # the last line gets its <eos> too
    assert corpus.valid.tolist() == [0, 3, 2]
    assert corpus.test.tolist() == [2, 1, 1, 2]
    every_word = load_corpus(TextDatasetConfig(path=str(folder), format="text"))
    assert every_word.vocabulary.tokens == ("a", "b", EOS, "c", "<unk>")


def test_text_format_by_character_reads_utf8_with_any_line_break(tmp_path: Path) -> None:
    folder = write_text(tmp_path, train="é b\r\nb\rb", valid="éx\n", test="b\n")
    corpus = load_corpus(TextDatasetConfig(path=str(folder), format="text", level="char"))
    assert corpus.vocabulary.tokens == ("é", " ", "b", EOS, "<unk>")
    assert corpus.train.tolist() == [0, 1, 2, 3, 2, 3, 2, 3]
    assert corpus.valid.tolist() == [0, 4, 3]
    (folder / "test.txt").write_bytes(b"\xff\n")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        read_corpus(TEXT_LAYOUTS["char"].sources(folder), "characters", "unk", "latin-1 test")


@pytest.mark.parametrize("level", ["word", "char"])
def test_a_byte_order_mark_opening_a_file_is_not_text(tmp_path: Path, level: str) -> None:
    """Windows editors open UTF-8 files with one: it was glued to the first word (another type than the same word
    elsewhere) or read as a character of its own."""
    plain = load_corpus(TextDatasetConfig(path=str(write_text(tmp_path / "plain", "hi yo\nyo hi\n", "hi\n", "yo\n")),
                                          format="text", level=level))
    marked = write_text(tmp_path / "marked", "\ufeffhi yo\r\nyo hi\r\n", "\ufeffhi\n", "\ufeffyo\n")
    read = load_corpus(TextDatasetConfig(path=str(marked), format="text", level=level))
    assert read.vocabulary.tokens == plain.vocabulary.tokens
    assert [read.train.tolist(), read.valid.tolist(), read.test.tolist()] == \
        [plain.train.tolist(), plain.valid.tolist(), plain.test.tolist()]


def test_text_format_fields_name_what_is_allowed() -> None:
    with pytest.raises(ValidationError, match="'word' or 'char'") as caught:
        dataset_from_dict({"path": "/data", "format": "text", "level": "words"})
    assert caught.value.errors()[0]["loc"] == ("level",)
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        dataset_from_dict({"path": "/data", "format": "text", "min_count": 0})
    with pytest.raises(ValidationError, match="unknown field; allowed: path, format, level, min_count"):
        dataset_from_dict({"path": "/data", "format": "text", "unknown_tokens": "unk"})
    with pytest.raises(ValidationError, match="unknown format 'txt'; allowed: ptb, ptb-char, wikitext, enwik8, text8, "
                                              "text"):
        dataset_from_dict({"path": "/data", "format": "txt"})
    with pytest.raises(ValueError, match="min_count: got 2 with unknown_tokens 'error'"):
        read_corpus({}, "lines", "error", "rare", min_count=2)


def test_a_relative_folder_is_stored_absolute_and_read_from_any_working_directory(tmp_path, monkeypatch) -> None:
    """Trials read the data in Ray workers, whose working directory is not the launching one."""
    write_ptb(tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    local = dataset_from_dict({"path": "corpus", "format": "ptb"})
    text = dataset_from_dict({"path": "./corpus", "format": "text"})
    assert local.path == text.path == str(tmp_path / "corpus")
    assert dataset_from_dict(local.model_dump()) == local  # a stored spec validates to itself
    monkeypatch.chdir("/")
    assert load_corpus(dataset_from_dict(local.model_dump())).train.numel() == 8


def test_a_local_folder_is_verified_against_its_sha256sums(tmp_path: Path) -> None:
    folder = write_ptb(tmp_path)
    (folder / CHECKSUMS).write_text(f"{'0' * 64}  ptb.train.txt\n")
    with pytest.raises(ValueError, match=r"ptb\.train\.txt: SHA-256 is [0-9a-f]{64}, expected 0{64}"):
        local_corpus(LocalDatasetConfig(path=str(folder), format="ptb"))
    (folder / CHECKSUMS).write_text(f"{sha256_of(folder / 'ptb.train.txt')}  ptb.train.txt\n")
    assert len(local_corpus(LocalDatasetConfig(path=str(folder), format="ptb")).vocabulary) == 4


def test_byte_layout_holds_out_the_last_bytes_for_validation_then_test(tmp_path: Path) -> None:
    (tmp_path / "bytes").write_bytes(b"abcab\nba" + b"ab" + b"ba")
    layout = Layout("bytes", single_file="bytes", held_out_bytes=2)
    corpus = read_corpus(layout.sources(tmp_path), layout.tokenisation, "error", "bytes")
    assert corpus.vocabulary.tokens == ("97", "98", "99", EOS)
    assert corpus.train.tolist() == [0, 1, 2, 0, 1, 3, 1, 0]
    assert corpus.valid.tolist() == [0, 1]
    assert corpus.test.tolist() == [1, 0]
    assert str(layout.sources(tmp_path)["valid"]).endswith("bytes bytes 8+2")


def test_generated_corpora_are_dataset_configurations() -> None:
    markov = dataset_from_dict({"generator": "markov", "train_tokens": 1000, "valid_tokens": 200, "test_tokens": 200})
    assert isinstance(markov, MarkovCorpusConfig) and load_corpus(markov).best_cross_entropy > 0
    with pytest.raises(ValidationError, match="needs one of: name .*, path .*, generator"):
        dataset_from_dict({"nme": "ptb"})
    with pytest.raises(ValidationError, match="unknown generator 'zipf'; allowed: markov, reverse-copy"):
        dataset_from_dict({"generator": "zipf"})


def test_a_markov_chain_too_large_to_draw_is_refused_with_the_fields_to_lower() -> None:
    dataset_from_dict({"generator": "markov", "vocab_size": 1000, "order": 2})  # a million contexts: accepted
    with pytest.raises(ValidationError, match=r"vocab_size \*\* order is 1,000,000,000 contexts, over the "
                                              r"1,000,000 .* lower vocab_size or order"):
        dataset_from_dict({"generator": "markov", "vocab_size": 1000, "order": 3})


def test_reverse_copy_examples_and_best_possible_loss() -> None:
    config = ReverseCopyConfig(symbols=7, length=4, train_examples=30, valid_examples=5, test_examples=5)
    corpus = load_corpus(config)
    tokens = corpus.vocabulary.tokens
    examples = corpus.train.view(30, 2 * 4 + 2)
    for example in examples.tolist():
        forward, marker, backward, end = example[:4], example[4], example[5:9], example[9]
        assert tokens[marker] == "<sep>" and tokens[end] == EOS
        assert backward == forward[::-1]
        assert all(tokens[i].startswith("s") for i in forward)
    assert corpus.best_cross_entropy == pytest.approx(4 * math.log(7) / 10)
    assert not torch.equal(corpus.valid, corpus.test)


def make_archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_fetch_downloads_extracts_and_records_checksums_on_first_use(tmp_path: Path) -> None:
    files = {"ptb.train.txt": b"a b\n", "ptb.valid.txt": b"a\n", "ptb.test.txt": b"b\n"}
    archive = make_archive(tmp_path / "examples.tgz", {f"examples/data/{n}": d for n, d in files.items()})
    dataset = RegisteredDataset("tiny", archive.as_uri(), "ptb", {n: f"examples/data/{n}" for n in files}, "tiny")
    folder = fetch_dataset(dataset, tmp_path / "cache")
    assert folder == tmp_path / "cache" / "tiny"
    recorded = read_checksums(folder / CHECKSUMS)
    assert recorded == {**{n: sha256_of(folder / n) for n in files}, "examples.tgz": sha256_of(archive)}
    assert (folder / "ptb.train.txt").read_bytes() == files["ptb.train.txt"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*files, CHECKSUMS])  # the archive is not kept

    (folder / "ptb.valid.txt").write_bytes(b"tampered\n")
    with pytest.raises(ValueError, match=r"ptb\.valid\.txt: SHA-256 is .* \(recorded in .*SHA256SUMS\).*delete"):
        fetch_dataset(dataset, tmp_path / "cache")


def test_fetch_checks_pinned_checksums_and_archive_members(tmp_path: Path) -> None:
    files = {"ptb.train.txt": b"a b\n", "ptb.valid.txt": b"a\n", "ptb.test.txt": b"b\n"}
    archive = make_archive(tmp_path / "examples.tgz", files)
    pinned = RegisteredDataset("pinned", archive.as_uri(), "ptb", {n: n for n in files}, "pinned",
                               sha256={"ptb.train.txt": "f" * 64})
    with pytest.raises(ValueError, match=r"expected f{64} \(pinned in the dataset registry\)"):
        fetch_dataset(pinned, tmp_path / "cache")
    wrong = RegisteredDataset("wrong", archive.as_uri(), "ptb", {n: f"data/{n}" for n in files}, "wrong")
    with pytest.raises(ValueError, match="no member 'data/ptb.train.txt'; it is not the expected archive"):
        fetch_dataset(wrong, tmp_path / "cache")


def test_fetch_failure_says_how_to_get_the_files_by_hand(tmp_path: Path) -> None:
    missing = RegisteredDataset("gone", (tmp_path / "gone.tgz").as_uri(), "ptb",
                                {"ptb.train.txt": "data/ptb.train.txt"}, "gone")
    with pytest.raises(RuntimeError) as failed:
        fetch_dataset(missing, tmp_path / "cache")
    assert str(failed.value).startswith(f"dataset 'gone': could not download {missing.url} (No such file or "
                                        f"directory); check the network, or to import a copy downloaded elsewhere, "
                                        f"`tuner data fetch gone --cache-dir {tmp_path / 'cache'} --from gone.tgz`")
    assert "with DIR holding ptb.train.txt laid flat or in the archive's folders (data/)" in str(failed.value)
    assert not (tmp_path / "cache").exists()  # a failed fetch leaves nothing behind


def test_a_cache_folder_that_cannot_be_made_is_named_with_where_to_keep_datasets(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    dataset = RegisteredDataset("tiny", (tmp_path / "tiny.tgz").as_uri(), "ptb", {"ptb.train.txt": "ptb.train.txt"},
                                "tiny")
    with pytest.raises(RuntimeError, match=rf"folder {a_file}/tiny \(Not a directory\); .*LM_TUNER_DATA"):
        fetch_dataset(dataset, a_file)


def test_registry_lists_the_six_datasets_with_their_layouts() -> None:
    assert sorted(REGISTRY) == ["enwik8", "ptb", "ptb-char", "text8", "wikitext-103", "wikitext-2"]
    assert set(typing.get_args(RegisteredName)) == set(REGISTRY)
    assert set(typing.get_args(FormatName)) == set(LAYOUTS)
    for dataset in REGISTRY.values():
        assert set(dataset.members) == set(LAYOUTS[dataset.layout].files)
        assert dataset.url.startswith(("http://", "https://"))
        assert set(dataset.sha256) <= set(dataset.members)


@pytest.mark.skipif(not SHARED_PTB.is_dir(), reason=f"no PTB files at {SHARED_PTB}")
def test_real_ptb_matches_the_pinned_checksums_and_standard_sizes() -> None:
    for name, digest in REGISTRY["ptb"].sha256.items():
        assert sha256_of(SHARED_PTB / name) == digest
    corpus = load_corpus(LocalDatasetConfig(path=str(SHARED_PTB), format="ptb"))
    assert len(corpus.vocabulary) == 10_000
    assert (corpus.train.numel(), corpus.valid.numel(), corpus.test.numel()) == (929_589, 73_760, 82_430)


@pytest.mark.skipif(not SHARED_PTB.is_dir(), reason=f"no PTB files at {SHARED_PTB}")
def test_real_ptb_as_plain_text_reads_like_the_ptb_format(tmp_path: Path) -> None:
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").symlink_to(SHARED_PTB / f"ptb.{split}.txt")
    text = load_corpus(TextDatasetConfig(path=str(tmp_path), format="text"))
    ptb = load_corpus(LocalDatasetConfig(path=str(SHARED_PTB), format="ptb"))
    assert text.vocabulary == ptb.vocabulary  # PTB's own <unk> is the unknown word
    for split in ("train", "valid", "test"):
        assert torch.equal(getattr(text, split), getattr(ptb, split))


def test_batchify_and_windows_carry_streams_in_order() -> None:
    batched = batchify(torch.arange(10), 2)
    assert batched.tolist() == [[0, 5], [1, 6], [2, 7], [3, 8], [4, 9]]
    pieces = [(x.tolist(), y.tolist()) for x, y in windows(batched, 3)]
    assert pieces == [([[0, 5], [1, 6], [2, 7]], [[1, 6], [2, 7], [3, 8]]), ([[3, 8]], [[4, 9]])]


def test_training_stream_wraps_and_restores_its_position() -> None:
    stream = TrainingStream(batchify(torch.arange(22), 2), bptt=4)  # 11 rows: windows of 4, 4, 2
    starts = [stream.next_window()[2] for _ in range(4)]
    assert starts == [True, False, False, True]
    assert (stream.passes, stream.position, stream.epochs) == (1, 4, 1.4)


def test_variable_length_windows_follow_awd_lstm_and_resume_exactly() -> None:
    data = batchify(torch.arange(100_000), 1)
    stream = TrainingStream(data, bptt=70, variable_length=True, generator=torch.Generator().manual_seed(0))
    lengths = [stream.next_window()[0].shape[0] for _ in range(400)]
    assert min(lengths) >= 5 and len(set(lengths)) > 10
    assert 60 < sum(lengths) / len(lengths) < 72  # N(70, 5) mostly, N(35, 5) one time in 20
    saved = stream.state_dict()
    expected = [stream.next_window()[0].shape[0] for _ in range(20)]
    stream.load_state_dict(saved)
    assert [stream.next_window()[0].shape[0] for _ in range(20)] == expected


def test_text_source_describes_itself(tmp_path: Path) -> None:
    assert str(TextSource(tmp_path / "x")) == str(tmp_path / "x")


def test_tuner_data_fetch_reports_the_verified_files(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from lm_tuner.trainers import registry
    from lm_tuner.tuner.cli.app import app

    files = {"ptb.train.txt": b"a b\n", "ptb.valid.txt": b"a\n", "ptb.test.txt": b"b\n"}
    archive = make_archive(tmp_path / "examples.tgz", {f"data/{n}": d for n, d in files.items()})
    local = RegisteredDataset("ptb", archive.as_uri(), "ptb", {n: f"data/{n}" for n in files}, "tiny ptb")
    monkeypatch.setitem(registry.REGISTRY, "ptb", local)
    runner = CliRunner()
    fetched = runner.invoke(app, ["data", "fetch", "ptb", "--cache-dir", str(tmp_path / "cache")])
    assert fetched.exit_code == 0, fetched.output
    assert str(tmp_path / "cache" / "ptb") in fetched.output.replace("\n", "")
    assert sha256_of(tmp_path / "cache" / "ptb" / "ptb.valid.txt") in fetched.output
    assert "recorded in SHA256SUMS at first download" in fetched.output
    pinned = RegisteredDataset("ptb", archive.as_uri(), "ptb", {n: f"data/{n}" for n in files}, "tiny ptb",
                               archive_sha256=sha256_of(archive))
    monkeypatch.setitem(registry.REGISTRY, "ptb", pinned)
    again = runner.invoke(app, ["data", "fetch", "ptb", "--cache-dir", str(tmp_path / "pinned")])
    assert again.exit_code == 0 and again.output.count("from the archive pinned in the registry") == 3, again.output
    unknown = runner.invoke(app, ["data", "fetch", "ptb-word"])
    assert unknown.exit_code == 2 and "error: dataset: unknown name 'ptb-word'; registered: ptb, ptb-char" in \
        unknown.output


def test_a_study_spec_accepts_every_kind_of_dataset() -> None:
    from lm_tuner.tuner.spec import StudySpec

    base = {"name": "s", "families": ["lstm"], "parameter_budget": 1000, "search_space": {},
            "tuning": {"trials": 1}}
    for dataset in ({"name": "ptb"}, {"path": "/data/ptb", "format": "ptb"}, {"generator": "reverse-copy"},
                    {"path": "/data/any", "format": "text", "level": "char", "min_count": 3}):
        spec = StudySpec.model_validate(base | {"dataset": dataset})
        assert spec.dataset == dataset_from_dict(dataset)
        assert StudySpec.model_validate(spec.model_dump(mode="json")) == spec
    with pytest.raises(ValidationError) as caught:
        StudySpec.model_validate(base | {"dataset": {"generator": "reverse-copy", "colour": "blue"}})
    [error] = caught.value.errors()
    assert error["loc"] == ("dataset", "colour")
    assert error["msg"] == ("unknown field; allowed: generator, symbols, length, train_examples, valid_examples, "
                            "test_examples, seed")
