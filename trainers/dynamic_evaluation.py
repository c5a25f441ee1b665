"""Dynamic evaluation (Krause et al. 2018; Krause thesis section 4.5, eq. 4.2-4.7): "global RMS with
an RMS decay prior".

The text is read as one stream (batch size 1) in segments of `max_time_steps` tokens, the state
carried. Each segment is scored first, then one update adapts the weights to it:

    theta <- theta - eta * g / (MS + epsilon) + lambda * RMSnorm * (theta_0 - theta)

where g is the gradient of the segment's mean token loss, MS = sqrt(mean of g^2 over training
windows) is computed once per model with dropout off (eq. 4.4), and RMSnorm = MS / mean(MS) over all
weights (eq. 4.6), clipped to at most 1 / lambda so that no weight decays past theta_0. Every pass
(validation, test, each Monte-Carlo sample) starts from theta_0, the weights the model has when it
is called, and leaves them unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from lm_tuner.models import LanguageModel, detach_state, monte_carlo_dropout
from lm_tuner.trainers.batching import batchify, windows
from lm_tuner.trainers.evaluation import evaluation_mode
from lm_tuner.trainers.objective import token_nll


class DynamicEvaluationConfig(BaseModel):
    """The tuned hyperparameters of dynamic evaluation (Melis thesis, Table 2.6 for their ranges)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_time_steps: int = Field(5, ge=1, description="segment length: tokens scored between two updates")
    learning_rate: float = Field(1e-4, ge=0, description="eta")
    decay: float = Field(1e-3, ge=0, description="lambda, the decay rate towards theta_0")
    epsilon: float = Field(1e-5, gt=0, description="added to MS before dividing")


def gradient_rms(model: LanguageModel, stream: Tensor, *, batch_size: int = 1024, bptt: int = 70,
                 max_windows: int | None = None) -> list[Tensor]:
    """MS of every parameter: the root mean square over training windows of the gradient of the
    window's mean token loss, dropout off, state carried (at most `max_windows` windows)."""
    params = list(model.parameters())
    squares = [torch.zeros_like(p) for p in params]
    batched = batchify(stream, batch_size).to(model.output_bias.device)
    state = model.initial_state(batch_size)
    count = 0
    with evaluation_mode(model):
        for inputs, targets in windows(batched, bptt):
            if count == max_windows:
                break
            state = detach_state(state)
            logits, state = model(inputs, state)
            model.zero_grad(set_to_none=True)
            token_nll(logits, targets).mean().backward()
            with torch.no_grad():
                torch._foreach_addcmul_(squares, [p.grad for p in params], [p.grad for p in params])
            count += 1
    model.zero_grad(set_to_none=True)
    return [(square / count).sqrt_() for square in squares]


def dynamic_cross_entropy(model: LanguageModel, stream: Tensor, rms: list[Tensor], config: DynamicEvaluationConfig,
                          *, logit_scale: float = 1.0, mc_samples: int = 0, mc_multiplier: float = 1.0) -> float:
    """Mean token loss (nats) of `stream` under dynamic evaluation, dropout off.

    With `mc_samples`, each of that many passes runs with Monte-Carlo dropout (every rate times
    `mc_multiplier`), adapting from theta_0 on its own, and each token's probabilities are averaged
    over the passes.
    """
    if mc_samples == 0:
        with evaluation_mode(model):
            losses = _adapting_pass(model, stream, rms, config, logit_scale)
        return sum(loss.sum().item() for loss in losses) / sum(loss.numel() for loss in losses)
    with monte_carlo_dropout(model, mc_multiplier):
        passes = [torch.cat(_adapting_pass(model, stream, rms, config, logit_scale)) for _ in range(mc_samples)]
    log_mean_probability = torch.logsumexp(-torch.stack(passes), dim=0) - math.log(mc_samples)
    return -log_mean_probability.mean().item()


def _adapting_pass(model: LanguageModel, stream: Tensor, rms: list[Tensor], config: DynamicEvaluationConfig,
                   logit_scale: float) -> list[Tensor]:
    """Token losses (float64) of each segment, scored before the update that adapts to it; the weights
    are back at theta_0 afterwards."""
    params = list(model.parameters())
    initial = [p.detach().clone() for p in params]
    step_sizes = [config.learning_rate / (ms + config.epsilon) for ms in rms]
    mean_rms = sum(ms.sum() for ms in rms) / sum(ms.numel() for ms in rms)
    decay_rates = [(config.decay * ms / mean_rms).clamp_(max=1.0) for ms in rms]  # lambda * min(RMSnorm, 1/lambda)
    embedding = model.embedding.weight
    embedding_steps = next(s for p, s in zip(params, step_sizes, strict=True) if p is embedding)
    batched = batchify(stream, 1).to(model.output_bias.device)
    state = model.initial_state(1)
    losses = []
    try:
        with embedding_lookups_as_leaves(model) as lookups:
            for inputs, targets in windows(batched, config.max_time_steps):
                state = detach_state(state)
                logits, state = model(inputs, state)
                nll = token_nll(logits, targets, logit_scale)
                losses.append(nll.detach().double().flatten())
                lookup = lookups.pop()
                *grads, lookup_grad = torch.autograd.grad(nll.mean(), [*params, lookup], allow_unused=True)
                with torch.no_grad():
                    torch._foreach_lerp_(params, initial, decay_rates)  # + lambda RMSnorm (theta_0 - theta)
                    used = [(p, g, s) for p, g, s in zip(params, grads, step_sizes, strict=True) if g is not None]
                    torch._foreach_addcmul_([p for p, _, _ in used], [g for _, g, _ in used], [s for _, _, s in used],
                                            value=-1.0)  # - eta g / (MS + epsilon)
                    rows = inputs.flatten()
                    embedding.index_add_(0, rows, lookup_grad.flatten(0, 1) * embedding_steps[rows], alpha=-1.0)
    finally:
        with torch.no_grad():
            torch._foreach_copy_(params, initial)
    return losses


@contextmanager
def embedding_lookups_as_leaves(model: LanguageModel) -> Iterator[list[Tensor]]:
    """Makes each embedding lookup's output a leaf of the graph and collects it.

    Its gradient holds one row per token, added to those rows of the embedding by hand (an untied
    embedding then gets no gradient from autograd at all). Through autograd it would become a dense
    vocabulary-sized gradient, added to the softmax's when tied: zeroing, scattering into and adding
    that full matrix for a segment's few rows took 42% of the backward pass of a 4M-parameter LSTM
    on 2 CPU threads.
    """
    lookups: list[Tensor] = []

    def detach(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor:
        lookups.append(output.detach().requires_grad_())
        return lookups[-1]

    handle = model.embedding.register_forward_hook(detach)
    try:
        yield lookups
    finally:
        handle.remove()
