"""Dataset configurations and `load_corpus`: a configuration in, a Corpus out.

A dataset is one of
- `name: ptb` (or ptb-char, wikitext-2, wikitext-103, enwik8, text8): a registered dataset,
  downloaded into the cache on first use and verified by checksum;
- `path: DIR` with `format: ptb` (or ptb-char, wikitext, enwik8, text8): local files laid out like
  the registered dataset of that format;
- `path: DIR` with `format: text`: any corpus as train.txt, valid.txt and test.txt, read by word or by
  character, with a vocabulary from the training split and <unk> for the rest;
- `generator: markov` or `generator: reverse-copy`: a corpus generated on the fly.
"""

from __future__ import annotations

import typing
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from lm_tuner.trainers.checksums import CHECKSUMS, verify_checksums
from lm_tuner.trainers.corpus import Corpus
from lm_tuner.trainers.files import default_cache_dir
from lm_tuner.trainers.generated import MarkovCorpusConfig, ReverseCopyConfig, markov_corpus, reverse_copy_corpus
from lm_tuner.trainers.registry import LAYOUTS, TEXT_LAYOUTS, DatasetNotFetched, Layout, fetch_dataset, registered
from lm_tuner.trainers.text import UnknownTokens, read_corpus

RegisteredName = Literal["ptb", "ptb-char", "wikitext-2", "wikitext-103", "enwik8", "text8"]
FormatName = Literal["ptb", "ptb-char", "wikitext", "enwik8", "text8"]
TEXT_FORMAT = "text"
LOCAL_FORMATS = (*typing.get_args(FormatName), TEXT_FORMAT)

PTB_VOCABULARY_SIZE = 10_000
"""Word types of the pinned PTB training split with <eos>; its validation and test words all occur in it."""
PTB_SPLIT_TOKENS = (929_589, 73_760, 82_430)
"""Tokens (words and <eos>) of the pinned PTB train, valid and test files, as `tuner data check` counts them."""

def _absolute(path: str) -> str:
    """A dataset folder as an absolute path: trials read it in processes (Ray workers) with working directories of
    their own, so a relative path is taken from the working directory of the process that reads the spec."""
    return str(Path(path).expanduser().absolute()) if path else path


FolderPath = Annotated[str, AfterValidator(_absolute)]

_UNKNOWN_TOKENS = Field(
    "error", description="validation/test tokens missing from the training split: error, unk (map to <unk>), "
                         "add (vocabulary from all splits)")


class RegisteredDatasetConfig(BaseModel):
    """A registered public dataset, fetched into the cache (`$LM_TUNER_DATA`) on first use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: RegisteredName
    unknown_tokens: UnknownTokens = _UNKNOWN_TOKENS


class LocalDatasetConfig(BaseModel):
    """Files in a local folder, laid out like the registered dataset of `format`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: FolderPath = Field(..., description="folder holding the files of the format; a relative path is taken "
                                              "from the working directory and stored absolute")
    format: FormatName
    unknown_tokens: UnknownTokens = _UNKNOWN_TOKENS


class TextDatasetConfig(BaseModel):
    """Any corpus as train.txt, valid.txt and test.txt in a folder, read by word or by character.

    The vocabulary is the training split's tokens seen at least `min_count` times, <eos> and <unk>;
    every other token, in any split, becomes <unk>.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: FolderPath = Field(..., description="folder holding train.txt, valid.txt and test.txt; a relative path is "
                                              "taken from the working directory and stored absolute")
    format: Literal["text"]
    level: Literal["word", "char"] = Field("word", description="word: whitespace-separated words; char: characters "
                                                               "(see Dataset formats)")
    min_count: int = Field(1, ge=1, description="times a word (or character) must occur in train.txt to be in the "
                                                "vocabulary; rarer ones, and valid/test tokens missing from train.txt, "
                                                "become `<unk>`")


LocalConfig = LocalDatasetConfig | TextDatasetConfig

DATASET_KINDS: dict[str, type[BaseModel]] = {
    "name": RegisteredDatasetConfig,
    "path": LocalDatasetConfig,
    TEXT_FORMAT: TextDatasetConfig,
    "markov": MarkovCorpusConfig,
    "reverse-copy": ReverseCopyConfig,
}


def _validate_dataset(data: Any) -> Any:
    """Validate a mapping with the configuration its keys select (`generator`, else `path`, else `name`).

    Errors keep plain field paths (`dataset.vocab_size`, not the union member's name), and an unknown
    field lists the fields of the selected configuration.
    """
    if not isinstance(data, dict):
        return data
    kind = data.get("generator") or (_local_kind(data) if "path" in data else "name" if "name" in data else None)
    if not isinstance(kind, str) or kind not in DATASET_KINDS:
        where, detail = (("generator",), f"unknown generator {kind!r}; allowed: markov, reverse-copy") \
            if "generator" in data else ((), "a dataset needs one of: name (a registered dataset), path (local files "
                                             "with a format), generator (markov or reverse-copy)")
        raise _errors("dataset", [(where, detail, data.get("generator", data))])
    model = DATASET_KINDS[kind]
    unknown = [key for key in data if key not in model.model_fields]
    if unknown:
        allowed = ", ".join(model.model_fields)
        raise _errors(model.__name__, [((key,), f"unknown field; allowed: {allowed}", data[key]) for key in unknown])
    return model.model_validate(data, strict=True)  # the caller's strictness does not reach through this validator


def _local_kind(data: dict) -> str:
    """`text` or `path` for a local folder, by its format; a missing or unknown format is refused with every allowed
    one."""
    if "format" not in data:
        raise ValidationError.from_exception_data("dataset", [{
            "type": PydanticCustomError("missing", "required field is missing; allowed: {allowed}",
                                        {"allowed": ", ".join(LOCAL_FORMATS)}),
            "loc": ("format",), "input": data}])
    if data["format"] not in LOCAL_FORMATS:
        raise _errors("dataset", [(("format",), f"unknown format {data['format']!r}; allowed: "
                                                f"{', '.join(LOCAL_FORMATS)}", data["format"])])
    return TEXT_FORMAT if data["format"] == TEXT_FORMAT else "path"


def _errors(title: str, problems: list[tuple[tuple[str, ...], str, Any]]) -> ValidationError:
    return ValidationError.from_exception_data(title, [
        {"type": PydanticCustomError("dataset", message), "loc": loc, "input": value}
        for loc, message, value in problems
    ])


DatasetConfig = Annotated[
    RegisteredDatasetConfig | LocalDatasetConfig | TextDatasetConfig | MarkovCorpusConfig | ReverseCopyConfig,
    BeforeValidator(_validate_dataset),
]
"""Every dataset configuration `load_corpus` accepts."""

_ADAPTER: TypeAdapter[DatasetConfig] = TypeAdapter(DatasetConfig)


def dataset_from_dict(data: dict) -> DatasetConfig:
    return _ADAPTER.validate_python(data)


def known_vocabulary_size(config: DatasetConfig) -> int | None:
    """The vocabulary size a configuration fixes before any file is read: that of a generated corpus, or of
    registered PTB (its files are pinned by checksum); None where only the files can tell."""
    if isinstance(config, MarkovCorpusConfig):
        return config.vocab_size
    if isinstance(config, ReverseCopyConfig):
        return config.symbols + 2  # <eos> and <sep>
    if isinstance(config, RegisteredDatasetConfig) and config.name == "ptb":
        return PTB_VOCABULARY_SIZE
    return None


def known_split_sizes(config: DatasetConfig) -> tuple[int, int, int] | None:
    """The train, valid and test tokens of a registered dataset whose files are pinned by checksum (PTB), known
    before it is downloaded; None for the others (generated corpora fix theirs in their configuration)."""
    if isinstance(config, RegisteredDatasetConfig) and config.name == "ptb":
        return PTB_SPLIT_TOKENS
    return None


def unreadable_data(error: Exception) -> str:
    """The one line a study whose data cannot be read is refused with, naming the field `dataset` once (a registered
    dataset's own errors start with "dataset 'NAME':")."""
    return str(error) if isinstance(error, DatasetNotFetched) else f"dataset: {error.args[0] if error.args else error}"


def load_corpus(config: DatasetConfig) -> Corpus:
    """Build the corpus a configuration describes, or take it from this process's cache while its files are as they
    were (size and modification time): a long-lived process (the API, a worker) reads changed files again."""
    return _read_corpus_of(config, _files_state(config))


def _files_state(config: DatasetConfig) -> tuple[tuple[str, int, int] | None, ...]:
    """(path, modification time, size) of each file a configuration's corpus is read from; None for a missing one."""
    if isinstance(config, LocalDatasetConfig | TextDatasetConfig):
        folder, names = Path(config.path).expanduser(), local_layout(config).files
    elif isinstance(config, RegisteredDatasetConfig):
        folder, names = default_cache_dir() / config.name, LAYOUTS[registered(config.name).layout].files
    else:  # generated: its configuration is all of it
        return ()
    return tuple(_file_state(folder / name) for name in (*names, CHECKSUMS))


def _file_state(path: Path) -> tuple[str, int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return str(path), status.st_mtime_ns, status.st_size


@lru_cache(maxsize=4)
def _read_corpus_of(config: DatasetConfig, files_state: tuple[tuple[str, int, int] | None, ...]) -> Corpus:
    if isinstance(config, MarkovCorpusConfig):
        return markov_corpus(config)
    if isinstance(config, ReverseCopyConfig):
        return reverse_copy_corpus(config)
    if isinstance(config, RegisteredDatasetConfig):
        dataset = registered(config.name)
        layout = LAYOUTS[dataset.layout]
        folder = fetch_dataset(dataset)
        return read_corpus(layout.sources(folder), layout.tokenisation, config.unknown_tokens, dataset.name)
    if isinstance(config, LocalDatasetConfig | TextDatasetConfig):
        return local_corpus(config)
    raise TypeError(f"dataset: unsupported configuration {type(config).__name__}")


def local_layout(config: LocalConfig) -> Layout:
    """How the files of a local folder are named and tokenised."""
    return TEXT_LAYOUTS[config.level] if isinstance(config, TextDatasetConfig) else LAYOUTS[config.format]


def local_corpus(config: LocalConfig) -> Corpus:
    folder = Path(config.path).expanduser()
    layout = local_layout(config)
    if not folder.is_dir():
        raise FileNotFoundError(f"dataset path: no folder at {folder}; give the folder that holds "
                                f"{', '.join(layout.files)} (format {config.format!r})")
    if (folder / CHECKSUMS).is_file():
        verify_checksums(folder, [name for name in layout.files if (folder / name).is_file()], pinned={},
                         remedy=f"replace the file or fix {folder / CHECKSUMS}", record=False)
    if isinstance(config, TextDatasetConfig):
        return read_corpus(layout.sources(folder), layout.tokenisation, "unk",
                           f"text files ({config.level} level) in {folder}", min_count=config.min_count)
    return read_corpus(layout.sources(folder), layout.tokenisation, config.unknown_tokens,
                       f"{config.format} files in {folder}")
