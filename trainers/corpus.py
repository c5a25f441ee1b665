"""Token streams and their vocabulary: what every dataset becomes before training."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

EOS = "<eos>"


@dataclass(frozen=True)
class Vocabulary:
    """An ordered set of tokens; a token's id is its position."""

    tokens: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("vocabulary: tokens must be unique")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_streams(cls, streams: Iterable[Sequence[str]]) -> Vocabulary:
        seen: dict[str, None] = {}
        for stream in streams:
            seen.update(dict.fromkeys(stream))
        return cls(tuple(seen))

    def encode(self, tokens: Sequence[str]) -> Tensor:
        index = {token: i for i, token in enumerate(self.tokens)}
        missing = sorted({t for t in tokens if t not in index})
        if missing:
            raise ValueError(f"tokens not in the vocabulary: {missing[:10]}")
        return torch.tensor([index[t] for t in tokens], dtype=torch.long)


@dataclass(frozen=True)
class Corpus:
    """Train/valid/test token-id streams over one vocabulary.

    `best_cross_entropy` is the lowest achievable cross-entropy (nats/token) where the data's
    generating process is known, else None. `reverse_copy_length` is the L of a reverse-copy task (examples of
    2L + 2 tokens whose reversed halves training scores apart, trainers.reverse_copy_scores), else None.
    """

    vocabulary: Vocabulary
    train: Tensor
    valid: Tensor
    test: Tensor
    description: str
    best_cross_entropy: float | None = None
    reverse_copy_length: int | None = None

    def __post_init__(self) -> None:
        for split in ("train", "valid", "test"):
            if getattr(self, split).numel() < 2:
                raise ValueError(f"corpus {self.description!r}: split {split!r} has fewer than 2 tokens")

    @cached_property
    def digest(self) -> str:
        """SHA-256 of what a model trains and is scored on: the vocabulary in order and the three token streams. Two
        reads of a dataset have the same digest exactly when they give the same tokens, whatever changed in between:
        its files, or how they are read."""
        digest = hashlib.sha256()
        streams = [getattr(self, split).to(torch.int64).contiguous() for split in ("train", "valid", "test")]
        digest.update(json.dumps([self.vocabulary.tokens, [stream.numel() for stream in streams]]).encode())
        for stream in streams:
            digest.update(memoryview(stream.numpy()))
        return digest.hexdigest()

