"""From text files to a Corpus: tokenisation, vocabulary building and the unknown-token policy.

Two tokenisations cover the registered datasets:
- `lines`: whitespace-separated tokens with <eos> after every line (PTB, PTB characters, WikiText),
  read like the pytorch/examples and AWD-LSTM loaders;
- `bytes`: every byte is a token, named by its decimal value, and a newline byte is <eos>
  (enwik8, text8).

The vocabulary comes from the training split, in order of first appearance. Validation or test
tokens that the training split lacks are handled by the unknown-token policy: `error` refuses them,
`unk` maps them to <unk>, `add` builds the vocabulary from all three splits.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch
from torch import Tensor

from lm_tuner.trainers.corpus import EOS, Corpus, Vocabulary

UNK = "<unk>"
SPLITS = ("train", "valid", "test")

Tokenisation = Literal["lines", "bytes"]
UnknownTokens = Literal["error", "unk", "add"]


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
    def types(self, source: TextSource) -> Iterable[str]:
        """The token types of a text, in order of first appearance."""

    def encode(self, source: TextSource, index: dict[str, int], unk: int | None) -> tuple[Tensor, set[str]]:
        """Token ids of a text (tokens missing from `index` become `unk`), and the types left unknown."""


class LineTokeniser:
    def types(self, source: TextSource) -> Iterable[str]:
        seen: dict[str, None] = {}
        with _whole_file(source).open(encoding="utf-8") as handle:
            for line in handle:
                seen.update(dict.fromkeys(line.split()))
                seen[EOS] = None
        return seen

    def encode(self, source: TextSource, index: dict[str, int], unk: int | None) -> tuple[Tensor, set[str]]:
        ids, unknown = array("q"), set()
        with _whole_file(source).open(encoding="utf-8") as handle:
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

    def types(self, source: TextSource) -> Iterable[str]:
        values, first = np.unique(source.read_bytes(), return_index=True)
        return [self.NAMES[int(values[i])] for i in np.argsort(first)]

    def encode(self, source: TextSource, index: dict[str, int], unk: int | None) -> tuple[Tensor, set[str]]:
        table = np.array([index.get(name, -1 if unk is None else unk) for name in self.NAMES], dtype=np.int64)
        codes = source.read_bytes()
        unknown = {self.NAMES[int(byte)] for byte in np.unique(codes) if table[byte] < 0}
        return torch.from_numpy(table[codes]), unknown


TOKENISERS: dict[str, Tokeniser] = {"lines": LineTokeniser(), "bytes": ByteTokeniser()}


def read_corpus(
    sources: dict[str, TextSource],
    tokenisation: Tokenisation,
    unknown_tokens: UnknownTokens,
    description: str,
) -> Corpus:
    """Tokenise the train/valid/test files and encode them over one vocabulary."""
    for split in SPLITS:
        if not sources[split].path.is_file():
            raise FileNotFoundError(f"dataset {description!r}: split {split!r} has no file at {sources[split].path}")
    tokeniser = TOKENISERS[tokenisation]
    seen: dict[str, None] = {}
    for split in SPLITS if unknown_tokens == "add" else ("train",):
        seen.update(dict.fromkeys(tokeniser.types(sources[split])))
    if unknown_tokens == "unk":
        seen[UNK] = None
    vocabulary = Vocabulary(tuple(seen))
    index = {token: i for i, token in enumerate(vocabulary.tokens)}
    streams = {}
    for split in SPLITS:
        streams[split], unknown = tokeniser.encode(sources[split], index, index.get(UNK))
        if not (streams[split] != index.get(EOS, -1)).any():
            raise ValueError(f"dataset {description!r}: split {split!r} ({sources[split]}) is empty; replace the "
                             f"file (or delete it from the cache so that it is downloaded again)")
        if unknown:
            raise ValueError(
                f"dataset {description!r}: split {split!r} ({sources[split]}) has {len(unknown)} token type(s) "
                f"missing from the training split, e.g. {sorted(unknown)[:5]}; set unknown_tokens: unk to map "
                f"them to {UNK}, or unknown_tokens: add to build the vocabulary from all splits"
            )
    return Corpus(vocabulary, streams["train"], streams["valid"], streams["test"], description)


def _whole_file(source: TextSource) -> Path:
    if source.offset != 0 or source.length != -1:
        raise ValueError(f"{source}: line tokenisation reads whole files only")
    return source.path
