"""Reverse-copy scores: the reversed half scored on its own, next to the all-token loss."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from lm_tuner.models import LanguageModel, ModelConfig
from lm_tuner.trainers import (
    MarkovCorpusConfig,
    ReverseCopyConfig,
    Schedule,
    TrainingConfig,
    load_checkpoint,
    load_corpus,
    reverse_copy_scores,
    train,
)
from lm_tuner.trainers.batching import batchify
from lm_tuner.trainers.evaluation import cross_entropy
from lm_tuner.trainers.objective import token_nll
from lm_tuner.trainers.reverse_copy_scores import reversed_half, whole_examples

CERTAIN = 1e4  # a logit margin that leaves no probability to the other tokens in float32


class Oracle(nn.Module):
    """The best possible predictor of a reverse-copy stream read from its start (one stream): uniform over the
    symbols in each first half, certain everywhere else. It remembers everything it has read."""

    def __init__(self, symbols: int, length: int) -> None:
        super().__init__()
        self.output_bias = nn.Parameter(torch.zeros(symbols + 2))
        self.length = length

    def initial_state(self, batch_size: int) -> list[int]:
        assert batch_size == 1
        return []

    def forward(self, tokens: Tensor, history: list[int]) -> tuple[Tensor, list[int]]:
        length, period = self.length, 2 * self.length + 2
        logits = torch.full((tokens.shape[0], 1, self.output_bias.numel()), -CERTAIN)
        for step, token in enumerate(tokens[:, 0].tolist()):
            history = [*history, token]
            target = len(history)  # stream position of the token to predict
            offset = target % period
            if offset < length:
                logits[step, 0, 2:] = 0.0
            elif offset == length:
                logits[step, 0, 1] = CERTAIN  # <sep>
            elif offset == period - 1:
                logits[step, 0, 0] = CERTAIN  # <eos>
            else:  # the reversed symbol at offset o copies the one at offset 2L - o of the same example
                logits[step, 0, history[target - offset + 2 * length - offset]] = CERTAIN
        return logits, history


class CopyPrevious(nn.Module):
    """Predicts that the next token repeats the current one: right on a reversed symbol only by chance."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))

    def initial_state(self, batch_size: int) -> list:
        return []

    def forward(self, tokens: Tensor, state: list) -> tuple[Tensor, list]:
        return CERTAIN * nn.functional.one_hot(tokens, self.output_bias.numel()).float(), state


def test_reversed_half_marks_the_reversed_symbols_only() -> None:
    # L = 2: s s <sep> r r <eos>, twice
    assert reversed_half(torch.arange(12), 2).tolist() == [False, False, False, True, True, False] * 2


def test_the_best_possible_predictor_is_perfect_on_the_reversed_half() -> None:
    config = ReverseCopyConfig(symbols=5, length=3, valid_examples=20)
    split = load_corpus(config).valid
    scores = reverse_copy_scores(Oracle(5, 3), split, 3, batch_size=1, bptt=7)
    assert scores.reversed_tokens == 20 * 3 and scores.tokens == split.numel() - 1
    assert scores.reversed_loss == pytest.approx(0.0, abs=1e-6)
    assert scores.reversed_accuracy == 1.0
    # every first-half symbol but the very first token (never a target) costs ln 5
    assert scores.loss == pytest.approx((20 * 3 - 1) * math.log(5) / (split.numel() - 1), rel=1e-6)


def test_accuracy_counts_the_reversed_symbols_of_every_stream() -> None:
    config = ReverseCopyConfig(symbols=3, length=4, valid_examples=50)
    split = load_corpus(config).valid
    batch_size, bptt = 3, 5
    scores = reverse_copy_scores(CopyPrevious(5), split, 4, batch_size=batch_size, bptt=bptt)
    steps = split.numel() // batch_size
    tokens, right = split.tolist(), []
    for stream in range(batch_size):
        for position in range(stream * steps + 1, (stream + 1) * steps):  # a stream's first token is no target
            if 4 < position % 10 <= 8:
                right.append(tokens[position] == tokens[position - 1])
    assert scores.reversed_tokens == len(right)
    assert scores.reversed_accuracy == sum(right) / len(right)
    assert 0 < scores.reversed_accuracy < 1


def test_losses_agree_with_a_whole_split_scored_in_one_pass() -> None:
    torch.manual_seed(0)
    config = ReverseCopyConfig(symbols=6, length=3, valid_examples=40)
    split = load_corpus(config).valid
    model = LanguageModel(ModelConfig(vocab_size=8, hidden_size=16, num_layers=1)).eval()
    scores = reverse_copy_scores(model, split, 3, batch_size=4, bptt=9)
    assert scores.loss == pytest.approx(cross_entropy(model, split, 4, 9), rel=1e-12)
    batched = batchify(split, 4)
    with torch.no_grad():
        logits, _ = model(batched[:-1], model.initial_state(4))
    nll = token_nll(logits, batched[1:])
    targets = batchify(torch.arange(split.numel()), 4)[1:] % 8
    in_reversed_half = (targets >= 4) & (targets <= 6)
    assert scores.reversed_loss == pytest.approx(nll[in_reversed_half].double().mean().item(), rel=1e-5)
    assert scores.reversed_accuracy == pytest.approx(
        (logits.argmax(-1) == batched[1:])[in_reversed_half].double().mean().item())


def test_a_length_other_than_the_tasks_is_refused() -> None:
    split = load_corpus(ReverseCopyConfig(symbols=5, length=3, valid_examples=10)).valid
    for wrong in (4, 5, 0):  # 4 divides the split's 80 tokens, 5 does not
        with pytest.raises(ValueError, match=f"length: got {wrong} for a split of 80 tokens; allowed: the task's L"):
            reverse_copy_scores(CopyPrevious(7), split, wrong, batch_size=1, bptt=5)


def test_a_mogrifier_is_scored_with_several_threads() -> None:
    # its CPU kernels split the batch over threads and update buffers in place, which inference mode forbids
    split = load_corpus(ReverseCopyConfig(symbols=6, length=3, valid_examples=400)).valid
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = LanguageModel(ModelConfig(vocab_size=8, hidden_size=64, family="mogrifier", mogrifier_rounds=2,
                                          mogrifier_rank=14))
        scores = reverse_copy_scores(model, split, 3, batch_size=16, bptt=35)
        assert scores.loss == pytest.approx(cross_entropy(model, split, 16, 35), rel=1e-9)
    finally:
        torch.set_num_threads(threads)


def test_training_reports_the_reversed_half_every_turn(tmp_path) -> None:
    task = ReverseCopyConfig(symbols=6, length=3, train_examples=300, valid_examples=30)
    corpus = load_corpus(task)
    schedule = Schedule(turns=3, steps_per_turn=5, batch_size=4, bptt=16, eval_batch_size=4, validation_tokens=100)
    model = ModelConfig(vocab_size=8, hidden_size=16, num_layers=1)
    result = train(model, TrainingConfig(schedule=schedule, learning_rate=0.01), corpus,
                   checkpoint_path=tmp_path / "best.pt", device=torch.device("cpu"))
    assert all(turn.reversed_loss is not None and 0 <= turn.reversed_accuracy <= 1 for turn in result.turns)
    best = result.turns[result.best_turn - 1]
    examples = whole_examples(corpus.valid, 3, 100)
    assert examples.numel() == 96  # the whole examples among the 100 tokens the turns score
    scores = reverse_copy_scores(load_checkpoint(tmp_path / "best.pt").model, examples, 3, batch_size=4, bptt=16,
                                 logit_scale=best.val_logit_scale)  # the scale the turn's validation loss chose
    assert (best.reversed_loss, best.reversed_accuracy) == (scores.reversed_loss, scores.reversed_accuracy)
    other = train(model, TrainingConfig(schedule=schedule, learning_rate=0.01),
                  load_corpus(MarkovCorpusConfig(vocab_size=8, train_tokens=600, valid_tokens=100, test_tokens=100)),
                  device=torch.device("cpu"))
    assert all(turn.reversed_loss is None and turn.reversed_accuracy is None for turn in other.turns)
