"""Deterministic evaluation: mean cross-entropy per token over one split."""

from __future__ import annotations

import torch
from torch import Tensor

from models import LanguageModel
from trainers.batching import batchify, windows


@torch.no_grad()
def cross_entropy(model: LanguageModel, stream: Tensor, batch_size: int, bptt: int) -> float:
    """Mean negative log-likelihood in nats per token, dropout off, state carried across windows."""
    was_training = model.training
    model.eval()
    device = model.output_bias.device
    batched = batchify(stream, batch_size).to(device)
    state = model.initial_state(batch_size)
    total, count = 0.0, 0
    for inputs, targets in windows(batched, bptt):
        logits, state = model(inputs, state)
        total += torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
        ).item()
        count += targets.numel()
    model.train(was_training)
    return total / count
