"""CUDA graphs of training windows compute what the eager layers compute (GPU-only; skipped without one)."""

import pytest
import torch

from lm_tuner.models import FAMILIES, LanguageModel, ModelConfig, detach_state, family
from lm_tuner.models.cuda_graphs import _graphs

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GRAPHED = [name for name in FAMILIES if family(name).cell not in ("gru", "transformer")]
"""The families whose layers are graphed: the GRU's (state (h,), cuDNN's fused window) and the Transformer's
(no recurrent layers) run eagerly."""


def _config(family: str, state_dropout: float) -> ModelConfig:
    rounds = 3 if family.startswith("mogrifier") else 0
    return ModelConfig(vocab_size=50, hidden_size=32, family=family, num_layers=2, mogrifier_rounds=rounds,
                       mogrifier_rank=4 if rounds else 0, input_dropout=0.1, state_dropout=state_dropout)


def _train(config: ModelConfig, graphs: bool, device: str, windows: list[int]) -> tuple[list[float], LanguageModel]:
    torch.manual_seed(0)
    model = LanguageModel(config).to(device)
    model.cuda_graphs = graphs
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.0, 0.999))
    tokens = torch.randint(50, (sum(windows) + 1, 8), generator=torch.Generator().manual_seed(1)).to(device)
    state, losses, start = model.initial_state(8), [], 0
    for length in windows:  # the last window is shorter: a second graph
        inputs, targets = tokens[start:start + length], tokens[start + 1:start + length + 1]
        start += length
        state = detach_state(state)
        logits, state = model(inputs, state)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


@cuda
@pytest.mark.parametrize("state_dropout", [0.0, 0.3])
@pytest.mark.parametrize("name", GRAPHED)
def test_graphed_training_matches_eager_training(name, state_dropout):
    config = _config(name, state_dropout)
    windows = [10, 10, 10, 7]
    eager_losses, eager = _train(config, False, "cuda", windows)
    graphed_losses, graphed = _train(config, True, "cuda", windows)
    assert all(len(_graphs[layer]) == 2 for layer in graphed.layers)  # one per window shape
    assert not any(module in _graphs for module in eager.modules())
    torch.testing.assert_close(graphed_losses, eager_losses, rtol=1e-6, atol=1e-6)
    for a, b in zip(graphed.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@cuda
@pytest.mark.parametrize("name", [name for name in FAMILIES if name not in GRAPHED])
def test_gru_and_transformer_layers_train_eagerly_with_graphs_on(name):
    losses, model = _train(_config(name, 0.3), True, "cuda", [10, 7])
    assert all(torch.isfinite(torch.tensor(losses)))
    assert not any(module in _graphs for module in model.modules())


@cuda
def test_evaluation_runs_eagerly():
    model = LanguageModel(_config("mogrifier", 0.2)).cuda().eval()
    tokens = torch.randint(50, (6, 4), device="cuda")
    with torch.no_grad():
        model(tokens, model.initial_state(4))
    model.train()
    with torch.no_grad():
        model(tokens, model.initial_state(4))
    assert not any(layer in _graphs for layer in model.layers)


def test_cpu_training_never_captures():
    losses, model = _train(_config("mogrifier", 0.2), True, "cpu", [5, 5])
    assert all(torch.isfinite(torch.tensor(losses)))
    assert not any(layer in _graphs for layer in model.layers)
