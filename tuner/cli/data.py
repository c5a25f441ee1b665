"""`tuner data`: the dataset registry from the command line, and checking a folder of text."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from lm_tuner.tuner.cli.common import JsonOutput, command_group, fail, refuse

if TYPE_CHECKING:
    from lm_tuner.trainers.corpus import Corpus
    from lm_tuner.trainers.datasets import LocalConfig
    from lm_tuner.trainers.registry import RegisteredDataset

data_app = command_group(help="Download (or import) and verify the registered datasets; check a folder of text.",
                         no_args_is_help=True)


@data_app.command()
def fetch(
    name: Annotated[str, typer.Argument(help="ptb, ptb-char, wikitext-2, wikitext-103, enwik8 or text8")],
    copy: Annotated[Optional[Path], typer.Option(
        "--from", metavar="ARCHIVE_OR_DIR",
        help="import a copy downloaded elsewhere instead of downloading: the dataset's archive (e.g. "
             "simple-examples.tgz for ptb), or a folder holding its files laid flat or in the archive's folders")
    ] = None,
    cache_dir: Annotated[Optional[Path], typer.Option(
        "--cache-dir", metavar="DIR", help="where datasets are kept [default: $LM_TUNER_DATA, "
                                           "else ~/.cache/lm-tuner/datasets]")] = None,
) -> None:
    """Download a registered dataset into the cache (once), or import a copy with --from, and verify its checksums.

    Exit status: 0 the files are in place and verified, 1 the download, the import or the check failed (the cache
    is left as it was), 2 no such dataset.
    """
    from lm_tuner.trainers.checksums import CHECKSUMS, read_checksums
    from lm_tuner.trainers.offline_copy import import_dataset
    from lm_tuner.trainers.registry import fetch_dataset, registered

    try:
        dataset = registered(name)
    except KeyError as error:
        refuse(error.args[0])
    try:
        folder = fetch_dataset(dataset, cache_dir) if copy is None else import_dataset(dataset, copy, cache_dir)
    except (RuntimeError, ValueError) as error:
        fail(error, 1)
    recorded = read_checksums(folder / CHECKSUMS)
    imported = "" if copy is None else f" (imported from {copy})"
    typer.echo(f"{dataset.name}: {dataset.description}\n{folder}{imported}")
    for file in dataset.members:
        typer.echo(f"{recorded[file]}  {file}  ({(folder / file).stat().st_size:,} bytes, "
                   f"{_verified_by(dataset, file, copy)})")


def _verified_by(dataset: RegisteredDataset, file: str, copy: Path | None) -> str:
    """What a file's digest was checked against when it entered the cache."""
    from lm_tuner.trainers.checksums import CHECKSUMS
    from lm_tuner.trainers.offline_copy import is_archive

    if file in dataset.sha256:
        return "pinned in the registry"
    if dataset.archive_sha256 and (copy is None or is_archive(copy)):
        return f"from the archive pinned in the registry, recorded in {CHECKSUMS}"
    return f"recorded in {CHECKSUMS} at first {'download' if copy is None else 'import'}"


@data_app.command()
def check(
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="the folder holding the dataset's files")],
    data_format: Annotated[str, typer.Option(
        "--format", metavar="FORMAT", help="ptb, ptb-char, wikitext, enwik8, text8 or text")],
    level: Annotated[Optional[str], typer.Option(
        "--level", help="format text: word (the default) or char")] = None,
    min_count: Annotated[Optional[int], typer.Option(
        "--min-count", metavar="N", help="format text: occurrences in train.txt a token needs to stay out of "
                                         "`<unk>` (default 1)")] = None,
    json_output: JsonOutput = False,
) -> None:
    """Check a folder of text before a study trains on it: vocabulary size, tokens per split, the
    out-of-vocabulary rate of valid and test, the unigram perplexity of valid and each file's SHA-256.

    The folder is read as a study with `path: DIR` and `format: FORMAT` would read it, except that for
    the formats other than text, the vocabulary holds the types of all three splits (unknown_tokens: add),
    so that types missing from train are counted instead of refused. Exit status: 0 checked, 2 the
    folder or a file is missing, empty or unreadable, or an option is wrong.
    """
    from lm_tuner.trainers.corpus_stats import UNIGRAM_MODEL, corpus_statistics
    from lm_tuner.trainers.datasets import local_corpus, local_layout
    from lm_tuner.trainers.files import sha256_of

    config = _local_config(folder, data_format, level, min_count)
    files = local_layout(config).files
    problem = _folder_problem(folder, data_format, files)
    if problem:
        refuse(problem)
    try:
        corpus = local_corpus(config)
        digests = {name: sha256_of(folder / name) for name in files}
    except (OSError, ValueError) as error:
        refuse(error)
    statistics = corpus_statistics(corpus)
    report = {"folder": str(folder), **config.model_dump(exclude={"path"}),
              "vocabulary": _vocabulary_rule(corpus, config), **asdict(statistics), "unigram_model": UNIGRAM_MODEL,
              "sha256": digests}
    if json_output:
        print(json.dumps(report, indent=2))
        return
    typer.echo(corpus.description)
    typer.echo(f"vocabulary: {statistics.vocabulary_size:,} types ({report['vocabulary']})")
    typer.echo("tokens: " + ", ".join(f"{split} {count:,}" for split, count in statistics.tokens.items())
               + " (<eos> included)")
    typer.echo("out of vocabulary (<unk>, or missing from train): "
               + ", ".join(f"{split} {rate:.2%}" for split, rate in statistics.out_of_vocabulary_rate.items()))
    typer.echo(f"unigram perplexity of valid: {statistics.unigram_perplexity:,.2f} "
               f"({math.log2(statistics.unigram_perplexity):.3f} bits per token; {UNIGRAM_MODEL})")
    for name, digest in digests.items():
        typer.echo(f"sha256 {digest}  {name}")


def _local_config(folder: Path, data_format: str, level: str | None, min_count: int | None) -> LocalConfig:
    """The dataset configuration a study would give for the folder, with a vocabulary from every split for the
    formats other than text."""
    from pydantic import ValidationError

    from lm_tuner.trainers.datasets import LOCAL_FORMATS, TEXT_FORMAT, dataset_from_dict

    if data_format not in LOCAL_FORMATS:
        refuse(f"--format: got {data_format!r}; allowed: {', '.join(LOCAL_FORMATS)}")
    data: dict = {"path": str(folder), "format": data_format}
    if data_format == TEXT_FORMAT:
        data |= {"level": level or "word", "min_count": 1 if min_count is None else min_count}
    elif level is not None or min_count is not None:
        refuse(f"--level and --min-count: given with --format {data_format}; allowed: with --format text only")
    else:
        data["unknown_tokens"] = "add"
    try:
        return dataset_from_dict(data)
    except ValidationError as error:
        refuse("; ".join(f"--{str(e['loc'][-1]).replace('_', '-')}: {e['msg']} (got {e['input']!r})"
                         for e in error.errors()))


def _folder_problem(folder: Path, data_format: str, files: tuple[str, ...]) -> str | None:
    needs = f"format {data_format} needs {', '.join(files)}"
    if folder.is_file():
        return f"{folder}: is a file, not a folder; give the folder that holds the split files ({needs})"
    if not folder.is_dir():
        return f"{folder}: no such folder; {needs}"
    try:
        present = {entry.name for entry in folder.iterdir() if entry.is_file()}
    except OSError as error:
        return f"{folder}: cannot read the folder ({error.strerror}); {needs}"
    if not present:
        return f"{folder}: the folder holds no files; {needs}"
    missing = [name for name in files if name not in present]
    return f"{folder}: no {', '.join(missing)}; {needs}" if missing else None


def _vocabulary_rule(corpus: Corpus, config: LocalConfig) -> str:
    from lm_tuner.trainers.corpus_stats import types_missing_from_train
    from lm_tuner.trainers.datasets import TextDatasetConfig

    if isinstance(config, TextDatasetConfig):
        kept = "every token of train" if config.min_count == 1 else \
            f"the tokens of train seen at least {config.min_count} times"
        return f"{kept}, <eos> and <unk>; every other token becomes <unk>"
    return (f"the types of all three splits, as with unknown_tokens: add; {types_missing_from_train(corpus):,} of "
            f"them missing from train, which unknown_tokens: error refuses and unk maps to <unk>")
