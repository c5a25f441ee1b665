"""The GRU and Mogrifier GRU families: torch.nn.GRU's numbers, the cell loop, the mogrifier, budgets, state."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from lm_tuner.models import LanguageModel, ModelConfig, count_parameters, detach_state, solve_hidden_size
from lm_tuner.models.budget import count_parameters_by_building
from lm_tuner.models.gru import GRULanguageModel, GRULayer
from lm_tuner.models.gru_cell import GRUCell
from lm_tuner.models.recurrence import variational_mask
from lm_tuner.trainers import (
    DynamicEvaluationConfig,
    MarkovCorpusConfig,
    Schedule,
    TrainingConfig,
    cross_entropy,
    dynamic_cross_entropy,
    gradient_rms,
    load_corpus,
    monte_carlo_cross_entropy,
    train,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")


def gru_layer(input_size: int = 5, hidden: int = 6, rounds: int = 0, rank: int = 0) -> GRULayer:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=10, hidden_size=hidden, family="mogrifier_gru" if rounds else "gru",
                         mogrifier_rounds=rounds, mogrifier_rank=rank, input_embedding_ratio=input_size / hidden)
    return GRULayer(config, 0).double()


def window(steps: int = 7, batch: int = 3, input_size: int = 5, hidden: int = 6):
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(steps, batch, input_size, dtype=torch.float64, generator=generator)
    return inputs, torch.randn(batch, hidden, dtype=torch.float64, generator=generator).tanh()


def outputs_and_grads(module, inputs, h, parameters, run):
    inputs, h = (t.detach().requires_grad_() for t in (inputs, h))
    outputs, h_last = run(module, inputs, h)
    weights = torch.linspace(-1, 1, outputs.numel(), dtype=outputs.dtype).view_as(outputs)
    loss = (outputs * weights).sum() + 0.3 * h_last.sum()
    return [outputs, h_last, *torch.autograd.grad(loss, [inputs, h, *parameters])]


def run_layer(layer, inputs, h):
    outputs, (h_last,) = layer(inputs, (h,))
    return outputs, h_last


def run_torch_gru(gru, inputs, h):
    outputs, h_last = gru(inputs, h.unsqueeze(0))
    return outputs, h_last.squeeze(0)


@pytest.mark.parametrize("fast", [True, False], ids=["fused", "cell-loop"])
def test_the_gru_layer_computes_torch_grus_numbers_forward_and_backward(fast):
    layer = gru_layer()
    reference = nn.GRU(5, 6).double()
    reference.load_state_dict(layer.cell.state_dict())
    layer.fast = fast
    inputs, h = window()
    ours = outputs_and_grads(layer, inputs, h, list(layer.cell.parameters()), run_layer)
    theirs = outputs_and_grads(reference, inputs, h, list(reference.parameters()), run_torch_gru)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_the_fused_gru_serves_unless_state_dropout_or_a_mogrifier_needs_the_cell_loop(monkeypatch):
    steps = []
    monkeypatch.setattr(GRUCell, "step", lambda self, x_part, h_seen, h: steps.append(1) or h)
    inputs, h = window()
    gru_layer()(inputs, (h,))
    assert steps == []
    gru_layer()(inputs, (h,), variational_mask(3, 6, 0.3, inputs))
    gru_layer(rounds=2)(inputs, (h,))
    assert len(steps) == 2 * len(inputs)


def test_state_dropout_drops_what_the_gates_read_not_the_carried_state():
    layer, (inputs, h) = gru_layer(), window(steps=1)
    kept = layer(inputs, (h,), torch.ones_like(h))
    torch.testing.assert_close(kept, layer(inputs, (h,)), rtol=1e-12, atol=1e-12)
    zeros = torch.zeros_like(h)
    dropped, (h_next,) = layer(inputs, (h,), zeros)
    x_r, x_z, x_n = layer.cell.input_part(inputs[0]).chunk(3, dim=1)
    _, b_z, b_n = layer.cell.bias_hh_l0.chunk(3)
    z, n = torch.sigmoid(x_z + b_z), torch.tanh(x_n + torch.sigmoid(x_r) * b_n)
    torch.testing.assert_close(h_next, (1 - z) * n + z * h)  # h itself carried where the gates saw zeros


def test_the_initialisation_draws_each_tile_at_std_sqrt_one_over_fan_in():
    cell = GRUCell(400, 300)
    for tile in (*cell.weight_ih_l0.chunk(3), *cell.weight_hh_l0.chunk(3)):
        assert tile.std().item() == pytest.approx(math.sqrt(1 / tile.shape[1]), rel=0.02)
    r, z, n = cell.bias_ih_l0.chunk(3)
    assert z.mean().item() == pytest.approx(1.0, abs=0.2) and abs(r.mean().item()) < 0.2
    assert n.std().item() == pytest.approx(math.sqrt(1 / 300), rel=0.2)
    assert not cell.bias_hh_l0.any()
    chrono = GRUCell(4, 300, chrono_t_max=20.0).bias_ih_l0[300:600]
    assert chrono.min() >= 0 and chrono.max() <= math.log(19)


def models(rounds: int, rank: int = 0):
    """A GRU and a Mogrifier GRU with the same GRU weights (and embedding and softmax)."""
    fields = dict(vocab_size=13, hidden_size=8, num_layers=2)
    torch.manual_seed(0)
    plain = LanguageModel(ModelConfig(family="gru", **fields)).eval()
    torch.manual_seed(0)
    mogrified = LanguageModel(ModelConfig(family="mogrifier_gru", mogrifier_rounds=rounds, mogrifier_rank=rank,
                                          **fields)).eval()
    mogrified.load_state_dict(plain.state_dict(), strict=False)
    return plain, mogrified


def logits(model):
    tokens = torch.randint(13, (6, 4), generator=torch.Generator().manual_seed(0))
    return model(tokens, model.initial_state(4))[0]


def test_a_mogrifier_gru_of_0_rounds_is_the_gru_and_with_rounds_it_differs():
    plain, mogrified = models(rounds=0)
    assert isinstance(mogrified, GRULanguageModel) and all(layer.mogrifier is None for layer in mogrified.layers)
    torch.testing.assert_close(logits(plain), logits(mogrified), rtol=0, atol=0)
    for rank in (0, 2):
        plain, mogrified = models(rounds=3, rank=rank)
        assert len(mogrified.layers[0].mogrifier.projections) == 3
        assert not torch.allclose(logits(plain), logits(mogrified))


@pytest.mark.parametrize(("family", "rounds", "rank"), [("gru", 0, 0), ("mogrifier_gru", 4, 0),
                                                         ("mogrifier_gru", 5, 16)])
def test_the_budget_is_solved_exactly_within_it(family, rounds, rank):
    config = ModelConfig(vocab_size=10_000, hidden_size=1, family=family, mogrifier_rounds=rounds,
                         mogrifier_rank=rank, input_embedding_ratio=0.75, tie_embeddings=False)
    solved = solve_hidden_size(config, 2_000_000)
    assert count_parameters(solved) == count_parameters_by_building(solved) <= 2_000_000
    assert count_parameters(replace(solved, hidden_size=solved.hidden_size + 1)) > 2_000_000


@pytest.mark.parametrize(("family", "rounds"), [("gru", 0), ("mogrifier_gru", 2)])
def test_two_windows_with_the_state_carried_score_as_one(family, rounds):
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(vocab_size=13, hidden_size=8, family=family, mogrifier_rounds=rounds)).eval()
    tokens = torch.randint(13, (10, 3), generator=torch.Generator().manual_seed(0))
    whole, _ = model(tokens, model.initial_state(3))
    first, state = model(tokens[:4], model.initial_state(3))
    assert all(len(layer_state) == 1 and layer_state[0].shape == (3, 8) for layer_state in state)
    second, _ = model(tokens[4:], detach_state(state))
    torch.testing.assert_close(torch.cat([first, second]), whole, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(MarkovCorpusConfig(vocab_size=24, train_tokens=6000, valid_tokens=600, test_tokens=600))


@pytest.mark.parametrize(("family", "rounds", "rank"), [("gru", 0, 0), ("mogrifier_gru", 3, 4)])
def test_the_families_train_and_evaluate_with_carried_state(corpus, family, rounds, rank):
    model_config = ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=16, num_layers=2, family=family,
                               mogrifier_rounds=rounds, mogrifier_rank=rank, state_dropout=0.1, input_dropout=0.1)
    schedule = Schedule(turns=2, steps_per_turn=20, batch_size=8, bptt=10, eval_batch_size=4)
    result = train(model_config, TrainingConfig(schedule=schedule, learning_rate=1e-2), corpus, device=CPU)
    first, last = (turn.val_loss for turn in result.turns)
    assert last < first < math.log(len(corpus.vocabulary))  # better than uniform, and getting better
    torch.manual_seed(0)
    model = LanguageModel(model_config)
    static = cross_entropy(model, corpus.valid, 1, 7)
    rms = gradient_rms(model, corpus.train, batch_size=8, bptt=10, max_windows=2)
    frozen = DynamicEvaluationConfig(max_time_steps=7, learning_rate=0.0, decay=0.01)
    assert dynamic_cross_entropy(model, corpus.valid, rms, frozen) == pytest.approx(static, rel=1e-6)
    assert monte_carlo_cross_entropy(model, corpus.valid, 4, 20, multiplier=1.0, samples=2) > 0
