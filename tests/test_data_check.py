"""`tuner data check` and the corpus statistics it prints: on the real PTB files and on small folders."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from lm_tuner.trainers import LocalDatasetConfig, TextDatasetConfig, load_corpus
from lm_tuner.trainers.corpus_stats import corpus_statistics, out_of_vocabulary_rate, unigram_perplexity
from lm_tuner.trainers.registry import REGISTRY
from lm_tuner.tuner.cli.app import app

SHARED_PTB = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "ptb"


def check(*args: str) -> Result:
    return CliRunner().invoke(app, ["data", "check", *args])


def write_text_corpus(folder: Path, train: str = "the cat sat\nthe dog sat\n", valid: str = "the cat ran\n",
                      test: str = "a dog sat\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        (folder / f"{split}.txt").write_text(text, encoding="utf-8")
    return folder


def one_line_error(result: Result, *expected: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


def test_statistics_of_a_small_word_corpus(tmp_path: Path) -> None:
    corpus = load_corpus(TextDatasetConfig(path=str(write_text_corpus(tmp_path)), format="text"))
    # vocabulary: the, cat, sat, <eos>, dog, <unk>; valid "the cat ran": ran is <unk>; test "a dog sat": a is <unk>
    assert corpus.vocabulary.tokens == ("the", "cat", "sat", "<eos>", "dog", "<unk>")
    counts = {"the": 2, "cat": 1, "sat": 2, "<eos>": 2, "dog": 1, "<unk>": 0}
    expected = math.exp(-sum(math.log((counts[w] + 1) / (8 + 6)) for w in ("the", "cat", "<unk>", "<eos>")) / 4)
    assert unigram_perplexity(corpus) == pytest.approx(expected, rel=1e-12)
    assert unigram_perplexity(corpus, "test") > unigram_perplexity(corpus, "train")
    assert out_of_vocabulary_rate(corpus, "valid") == out_of_vocabulary_rate(corpus, "test") == 0.25
    statistics = corpus_statistics(corpus)
    assert (statistics.vocabulary_size, statistics.tokens) == (6, {"train": 8, "valid": 4, "test": 4})
    with pytest.raises(ValueError, match="split: got 'dev'; allowed: train, valid, test"):
        unigram_perplexity(corpus, "dev")


def test_types_missing_from_train_count_as_out_of_vocabulary_under_every_policy(tmp_path: Path) -> None:
    folder = tmp_path / "ptb"
    folder.mkdir()
    for split, text in (("train", "a b\n"), ("valid", "a zebra\n"), ("test", "b\n")):
        (folder / f"ptb.{split}.txt").write_text(text)
    for policy in ("unk", "add"):
        corpus = load_corpus(LocalDatasetConfig(path=str(folder), format="ptb", unknown_tokens=policy))
        assert out_of_vocabulary_rate(corpus, "valid") == pytest.approx(1 / 3)
        assert out_of_vocabulary_rate(corpus, "test") == 0
    result = check(str(folder), "--format", "ptb")  # refused by the default policy, counted by the check
    assert result.exit_code == 0, result.output
    assert "vocabulary: 4 types" in result.stdout and "1 of them missing from train" in result.stdout
    assert "valid 33.33%, test 0.00%" in result.stdout


def test_check_prints_the_statistics_and_checksums_of_a_text_folder(tmp_path: Path) -> None:
    folder = write_text_corpus(tmp_path / "words")
    result = check(str(folder), "--format", "text")
    assert result.exit_code == 0, result.output
    assert "vocabulary: 6 types" in result.stdout
    assert "tokens: train 8, valid 4, test 4" in result.stdout
    assert "valid 25.00%, test 25.00%" in result.stdout
    assert "add-one smoothing" in result.stdout
    from lm_tuner.trainers.files import sha256_of

    for name in ("train.txt", "valid.txt", "test.txt"):
        assert f"{sha256_of(folder / name)}  {name}" in result.stdout

    report = json.loads(check(str(folder), "--format", "text", "--level", "char", "--json").stdout)
    assert report["level"] == "char" and report["min_count"] == 1
    assert report["tokens"] == {"train": 24, "valid": 12, "test": 10}  # characters, spaces and <eos> included
    assert report["out_of_vocabulary_rate"]["valid"] == pytest.approx(2 / 12)  # "r" and "n" of "ran"
    assert report["unigram_model"].startswith("fit on train, add-one")
    rare = json.loads(check(str(folder), "--format", "text", "--min-count", "2", "--json").stdout)
    assert rare["vocabulary_size"] == 4  # the, sat, <eos>, <unk>


@pytest.mark.skipif(not SHARED_PTB.is_dir(), reason=f"no PTB files at {SHARED_PTB}")
def test_check_on_the_real_ptb_matches_counts_made_from_the_files() -> None:
    result = check(str(SHARED_PTB), "--format", "ptb", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["vocabulary_size"] == 10_000
    assert report["tokens"] == {"train": 929_589, "valid": 73_760, "test": 82_430}
    assert report["sha256"] == REGISTRY["ptb"].sha256
    words = {split: [word for line in (SHARED_PTB / f"ptb.{split}.txt").read_text().splitlines()
                     for word in (*line.split(), "<eos>")] for split in ("train", "valid", "test")}
    for split in ("valid", "test"):
        assert report["out_of_vocabulary_rate"][split] == pytest.approx(
            words[split].count("<unk>") / len(words[split]), rel=1e-12)
    counts = Counter(words["train"])
    log_likelihood = sum(math.log((counts[word] + 1) / (len(words["train"]) + 10_000)) for word in words["valid"])
    assert report["unigram_perplexity"] == pytest.approx(math.exp(-log_likelihood / len(words["valid"])), rel=1e-9)
    assert 600 < report["unigram_perplexity"] < 800  # the unigram baseline of PTB, about 690


def test_a_missing_empty_or_unreadable_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    one_line_error(check(str(tmp_path / "absent"), "--format", "text"), "absent: no such folder",
                   "format text needs train.txt, valid.txt, test.txt")
    (tmp_path / "empty").mkdir()
    one_line_error(check(str(tmp_path / "empty"), "--format", "ptb"), "holds no files", "ptb.train.txt")
    partial = write_text_corpus(tmp_path / "partial")
    (partial / "test.txt").unlink()
    one_line_error(check(str(partial), "--format", "text"), "no test.txt")
    binary = write_text_corpus(tmp_path / "binary")
    (binary / "valid.txt").write_bytes(b"caf\xe9\n")
    one_line_error(check(str(binary), "--format", "text"), "not UTF-8")
    blank = write_text_corpus(tmp_path / "blank", test="\n\n")
    one_line_error(check(str(blank), "--format", "text", "--level", "char"), "split 'test'", "is empty")


def test_wrong_options_name_what_is_allowed(tmp_path: Path) -> None:
    folder = write_text_corpus(tmp_path)
    one_line_error(check(str(folder), "--format", "txt"), "--format: got 'txt'",
                   "allowed: ptb, ptb-char, wikitext, enwik8, text8, text")
    one_line_error(check(str(folder), "--format", "text", "--level", "words"), "--level", "'word' or 'char'")
    one_line_error(check(str(folder), "--format", "text", "--min-count", "0"), "--min-count", "greater than or equal")
    one_line_error(check(str(folder), "--format", "ptb", "--level", "char"), "with --format text only")


def test_a_file_given_as_the_folder_and_an_empty_own_file_get_advice_that_fits(tmp_path: Path) -> None:
    folder = write_text_corpus(tmp_path / "mine")
    one_line_error(check(str(folder / "train.txt"), "--format", "text"), "train.txt: is a file, not a folder",
                   "format text needs train.txt, valid.txt, test.txt")
    (folder / "test.txt").write_text("")
    empty = check(str(folder), "--format", "text")
    one_line_error(empty, "split 'test'", "is empty; put the split's text in it")
    assert "cache" not in empty.output and "downloaded" not in empty.output  # the user's own file: never fetched
