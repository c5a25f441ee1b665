"""Per-token losses, the average of predicted probabilities over dropout samples, and activation regularisation.

Both the multi-sample dropout objective of training (Melis thesis ch. 4) and Monte-Carlo dropout
evaluation score a token by ln (1/D sum_d p(w_t | ., M_d)) over D dropout masks. Samples are laid
side by side along the batch dimension: row s * B + b is sample s of stream b, with its own
carried state, so all D samples run in one forward pass.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lm_tuner.models import LanguageModel

RecurrentState = list[tuple[Tensor, ...]]
"""Per layer, the tensors `LanguageModel.initial_state` returns."""


def token_nll(logits: Tensor, targets: Tensor, logit_scale: float = 1.0) -> Tensor:
    """Negative log-likelihood of each target, (time, batch); logits are multiplied by `logit_scale`."""
    if logit_scale != 1.0:
        logits = logits * logit_scale
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return nll.view(targets.shape)


def sample_rows(tokens: Tensor, samples: int) -> Tensor:
    """(time, batch) -> (time, samples * batch): every stream repeated once per sample."""
    return tokens if samples == 1 else tokens.repeat(1, samples)


def average_over_samples(nll: Tensor, samples: int) -> Tensor:
    """-ln of the mean probability over samples: (time, samples * batch) -> (time, batch)."""
    if samples == 1:
        return nll
    per_sample = nll.view(nll.shape[0], samples, -1)
    return math.log(samples) - torch.logsumexp(-per_sample, dim=1)


def multi_sample_nll(
    model: LanguageModel, inputs: Tensor, targets: Tensor, state: RecurrentState, samples: int
) -> tuple[Tensor, RecurrentState]:
    """Per-token loss (time, batch) under the D-sample objective; `state` has samples * batch rows."""
    logits, state = model(sample_rows(inputs, samples), state)
    return average_over_samples(token_nll(logits, sample_rows(targets, samples)), samples), state


def activation_regularisation(model: LanguageModel) -> Tensor | None:
    """AR + TAR of the model's last training forward pass, per token (to be added to the mean token loss), or None
    where its family has no such regularisers or their coefficients are 0 (then the model keeps nothing)."""
    outputs = model.take_last_layer_outputs()
    if outputs is None:
        return None
    raw, dropped = outputs
    return ar_tar(raw, dropped, model.config.ar_alpha, model.config.tar_beta)


def ar_tar(raw: Tensor, dropped: Tensor, alpha: float, beta: float) -> Tensor:
    """alpha * mean(dropped^2) + beta * mean((raw_t+1 - raw_t)^2) over (time, batch, units), as in AWD-LSTM
    (Merity et al. 2018, section 4.6, and its code): AR penalises the last layer's dropped-out outputs, TAR the
    changes of its outputs before dropout between consecutive steps of the window."""
    penalty = alpha * dropped.pow(2).mean()
    if beta > 0 and raw.shape[0] > 1:
        penalty = penalty + beta * (raw[1:] - raw[:-1]).pow(2).mean()
    return penalty
