"""From text files to a Corpus: tokenisation, vocabulary building and the unknown-token policy.

Three tokenisations (`TOKENISATIONS` says what each does, for the spec reference):
- `lines`: whitespace-separated tokens with <eos> after every line (PTB, PTB characters, WikiText,
  word-level `text`), read like the pytorch/examples and AWD-LSTM loaders;
- `bytes`: every byte is a token, named by its decimal value, and a newline byte is <eos>
  (enwik8, text8);
- `characters`: every character of UTF-8 text is a token and every line ends with <eos>
  (character-level `text`).

The vocabulary comes from the training split, in order of first appearance. Validation or test
tokens that the training split lacks are handled by the unknown-token policy: `error` refuses them,
`unk` maps them to <unk>, `add` builds the vocabulary from all three splits. Under `unk`, a
`min_count` above 1 also maps training tokens seen fewer times than that to <unk>.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch
from torch import Tensor

from lm_tuner.trainers.corpus import EOS, Corpus, Vocabulary
from lm_tuner.trainers.files import default_cache_dir

UNK = "<unk>"
SPLITS = ("train", "valid", "test")

Tokenisation = Literal["lines", "bytes", "characters"]
UnknownTokens = Literal["error", "unk", "add"]

UTF8 = "utf-8-sig"  # UTF-8 that drops a byte-order mark opening the file (Windows editors write one), which
# would otherwise be glued to the first word, or be a character of its own

TOKENISATIONS: dict[str, tuple[str, str]] = {
    "lines": ("words", "the runs of non-whitespace characters of each line (Python's `str.split`), then `<eos>` "
                       "for the line break (a last line without one gets it too); a blank line is a lone `<eos>`; "
                       "a byte-order mark opening the file is not text"),
    "bytes": ("bytes", "every byte is a token (named by its decimal value) and the newline byte is `<eos>`; "
                       "the file is not decoded"),
    "characters": ("characters", "every Unicode character of each line is a token, spaces and tabs included, then "
                                 "`<eos>` for the line break (`\\n`, `\\r\\n` or `\\r`; a last line without one "
                                 "gets it too); a byte-order mark opening the file is not text"),
}
"""What each tokenisation makes tokens of, and how, in the words of the spec reference."""


@dataclass(frozen=True)
class TextSource:
    """The text of one split: a whole file, or `length` bytes of it from `offset` (-1: to the end)."""

    path: Path
    offset: int = 0
    length: int = -1

    def __str__(self) -> str:
        whole = self.offset == 0 and self.length == -1
        return str(self.path) if whole else f"{self.path} bytes {self.offset:,}+{self.length:,}"

    def read_bytes(self) -> np.ndarray:
        return np.fromfile(self.path, dtype=np.uint8, count=self.length, offset=self.offset)


class Tokeniser(Protocol):
    def counts(self, source: TextSource) -> dict[str, int]:
        """How often each token type occurs in a text, in order of first appearance."""

    def encode(self, source: TextSource, index: dict[str, int], unk: int | None) -> tuple[Tensor, set[str]]:
        """Token ids of a text (tokens missing from `index` become `unk`), and the types left unknown."""


class LineTokeniser:
    def counts(self, source: TextSource) -> dict[str, int]:
        counts: Counter[str] = Counter()
        with _whole_file(source).open(encoding=UTF8) as handle:
            for line in handle:
                counts.update(line.split())
                counts[EOS] += 1
        return dict(counts)

    def encode(self, source: TextSource, index: dict[str, int], unk: int | None) -> tuple[Tensor, set[str]]:
        ids, unknown = array("q"), set()
        with _whole_file(source).open(encoding=UTF8) as handle:
            for line in handle:
                for token in (*line.split(), EOS):
                    token_id = index.get(token, unk)
                    if token_id is None:
                        unknown.add(token)
                    else:
                        ids.append(token_id)
        return torch.from_numpy(np.frombuffer(ids, dtype=np.int64).copy()), unknown


class ByteTokeniser:
    NAMES = tuple(EOS if byte == ord("\n") else str(byte) for byte in range(256))

    def counts(self, source: TextSource) -> dict[str, int]:
        values, first, counts = np.unique(source.read_bytes(), return_index=True, return_counts=True)
        return {self.NAMES[int(values[i])]: int(counts[i]) for i in np.argsort(first)}

    def encode(self, source: TextSource, index: dict[str, int], unk: int | None) -> tuple[Tensor, set[str]]:
        table = np.array([index.get(name, -1 if unk is None else unk) for name in self.NAMES], dtype=np.int64)
        codes = source.read_bytes()
        unknown = {self.NAMES[int(byte)] for byte in np.unique(codes) if table[byte] < 0}
        return torch.from_numpy(table[codes]), unknown


class CharacterTokeniser:
    def counts(self, source: TextSource) -> dict[str, int]:
        values, first, counts = np.unique(self._code_points(source), return_index=True, return_counts=True)
        return {_character(int(values[i])): int(counts[i]) for i in np.argsort(first)}

    def encode(self, source: TextSource, index: dict[str, int], unk: int | None) -> tuple[Tensor, set[str]]:
        values, positions = np.unique(self._code_points(source), return_inverse=True)
        names = [_character(int(value)) for value in values]
        table = np.array([index.get(name, -1 if unk is None else unk) for name in names], dtype=np.int64)
        unknown = {name for name, token_id in zip(names, table, strict=True) if token_id < 0}
        return torch.from_numpy(table[positions.reshape(-1)]), unknown

    @staticmethod
    def _code_points(source: TextSource) -> np.ndarray:
        text = _whole_file(source).read_text(encoding=UTF8)  # universal newlines: \r\n and \r read as \n
        if text and not text.endswith("\n"):
            text += "\n"
        return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def _character(code_point: int) -> str:
    return EOS if code_point == ord("\n") else chr(code_point)


TOKENISERS: dict[str, Tokeniser] = {
    "lines": LineTokeniser(), "bytes": ByteTokeniser(), "characters": CharacterTokeniser(),
}


def read_corpus(
    sources: dict[str, TextSource],
    tokenisation: Tokenisation,
    unknown_tokens: UnknownTokens,
    description: str,
    *,
    min_count: int = 1,
) -> Corpus:
    """Tokenise the train/valid/test files and encode them over one vocabulary."""
    if min_count > 1 and unknown_tokens != "unk":
        raise ValueError(f"min_count: got {min_count} with unknown_tokens {unknown_tokens!r}; allowed: 1, or "
                         f"unknown_tokens: unk (rare training tokens need <unk> to map to)")
    for split in SPLITS:
        if not sources[split].path.is_file():
            raise FileNotFoundError(f"dataset {description!r}: split {split!r} has no file at {sources[split].path}")
    tokeniser = TOKENISERS[tokenisation]
    vocabulary = _vocabulary(tokeniser, sources, unknown_tokens, min_count)
    index = {token: i for i, token in enumerate(vocabulary.tokens)}
    streams = {split: _encode(tokeniser, sources[split], index, unknown_tokens, f"{description!r}: split "
                              f"{split!r} ({sources[split]})") for split in SPLITS}
    return Corpus(vocabulary, streams["train"], streams["valid"], streams["test"], description)


def _vocabulary(tokeniser: Tokeniser, sources: dict[str, TextSource], unknown_tokens: UnknownTokens,
                min_count: int) -> Vocabulary:
    """The training split's types (seen `min_count` times or more, <eos> always), in order of first appearance;
    then, under `add`, the other splits' types, or under `unk`, <unk>."""
    with _decoding(sources["train"]):
        counts = tokeniser.counts(sources["train"])
    seen = dict.fromkeys(token for token, count in counts.items() if count >= min_count or token == EOS)
    if unknown_tokens == "add":
        for split in ("valid", "test"):
            with _decoding(sources[split]):
                seen.update(dict.fromkeys(tokeniser.counts(sources[split])))
    if unknown_tokens == "unk":
        seen[UNK] = None
    return Vocabulary(tuple(seen))


def _encode(tokeniser: Tokeniser, source: TextSource, index: dict[str, int], unknown_tokens: UnknownTokens,
            where: str) -> Tensor:
    with _decoding(source):
        stream, unknown = tokeniser.encode(source, index, index[UNK] if unknown_tokens == "unk" else None)
    if unknown:
        raise ValueError(
            f"dataset {where} has {len(unknown)} token type(s) missing from the training split, e.g. "
            f"{sorted(unknown)[:5]}; set unknown_tokens: unk to map them to {UNK}, or unknown_tokens: add to build "
            f"the vocabulary from all splits"
        )
    if not (stream != index.get(EOS, -1)).any():
        raise ValueError(f"dataset {where} is empty; {_refill_advice(source.path)}")
    return stream


def _refill_advice(path: Path) -> str:
    """What to do about an empty split file: a downloaded one is fetched again once deleted, a user's own is not."""
    if path.resolve().is_relative_to(default_cache_dir().resolve()):
        return "delete the file from the dataset cache so that it is downloaded again"
    return "put the split's text in it"


@contextmanager
def _decoding(source: TextSource) -> Iterator[None]:
    try:
        yield
    except UnicodeDecodeError as error:
        raise ValueError(f"{source}: not UTF-8 text ({error.reason}); convert it to UTF-8") from error


def _whole_file(source: TextSource) -> Path:
    if source.offset != 0 or source.length != -1:
        raise ValueError(f"{source}: this tokenisation reads whole files only")
    return source.path
