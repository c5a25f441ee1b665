"""How much matrix-multiply work a model does per token, counted as benchmarks/cell_throughput.py counts it: 2 FLOPs
per weight a token passes through in the forward pass (every matrix of the layers and of the projection or mixture,
and the softmax's vocabulary x embedding matrix once per mixture component), 3 times that for forward plus backward.
The embedding lookup, biases, attention's own products and element-wise work are not counted: the achieved FLOP/s
the benchmark measures with the same count absorbs them at its shapes."""

from __future__ import annotations

from lm_tuner.models.budget import shapes_only
from lm_tuner.models.config import ModelConfig
from lm_tuner.models.language_model import LanguageModel

FORWARD_FLOPS_PER_WEIGHT = 2
TRAINING_PASSES = 3  # forward, and backward's two products (inputs' and weights' gradients)
INPUT_LOOKUPS = ("embedding.", "output_embedding")  # the softmax's matrix is counted from the configuration


def matmul_weights_per_token(config: ModelConfig) -> int:
    """Weights one token is multiplied with in the forward pass of `LanguageModel(config)`."""
    with shapes_only():
        model = LanguageModel(config)
    layers = sum(parameter.numel() for name, parameter in model.named_parameters()
                 if parameter.requires_grad and parameter.ndim >= 2 and not name.startswith(INPUT_LOOKUPS))
    return layers + config.vocab_size * config.embedding_size * config.softmax_components


def forward_flops_per_token(config: ModelConfig) -> int:
    return FORWARD_FLOPS_PER_WEIGHT * matmul_weights_per_token(config)


def training_flops_per_token(config: ModelConfig) -> int:
    return TRAINING_PASSES * forward_flops_per_token(config)
