"""AWD-LSTM (models/awd_lstm.py): the paper's sizes and budget, weight drop, locked dropout, initialisation."""

import math
from dataclasses import replace

import pytest
import torch

from lm_tuner.models import LanguageModel, ModelConfig, count_parameters, solve_hidden_size
from lm_tuner.models.awd_lstm import AWDLanguageModel, layer_sizes
from lm_tuner.models.budget import count_parameters_by_building, parameter_breakdown
from lm_tuner.models.recurrence import RecurrentLayer

PAPER = ModelConfig(vocab_size=10_000, hidden_size=1150, family="awd_lstm", num_layers=3,
                    input_embedding_ratio=400 / 1150, cap_input_gate=False, weight_drop=0.5, ar_alpha=2.0,
                    tar_beta=1.0, input_dropout=0.4, inter_layer_dropout=0.3, output_dropout=0.4,
                    embedding_dropout=0.1)
"""The PTB model of Merity et al. (2018), section 5: 3 layers, hidden 1150, embedding 400, tied."""


def _lstm_count(inputs: int, hidden: int) -> int:
    return 4 * hidden * (inputs + hidden) + 4 * hidden


def tiny(**fields) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 30, "hidden_size": 12, "family": "awd_lstm", "num_layers": 3,
                          "input_embedding_ratio": 0.5, "cap_input_gate": False} | fields)


def model_of(config: ModelConfig, seed: int = 0) -> LanguageModel:
    torch.manual_seed(seed)
    return LanguageModel(config)


def tokens(steps: int = 6, batch: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randint(30, (steps, batch), generator=torch.Generator().manual_seed(seed))


def test_the_paper_model_has_24m_parameters_in_layers_of_its_sizes():
    assert PAPER.embedding_size == 400
    assert layer_sizes(PAPER) == [(400, 1150), (1150, 1150), (1150, 400)]
    parts = parameter_breakdown(PAPER)
    assert parts["recurrent"] == _lstm_count(400, 1150) + _lstm_count(1150, 1150) + _lstm_count(1150, 400)
    assert parts == {"embedding": 4_000_000, "recurrent": 20_200_800, "softmax": 10_000, "total": 24_210_800}
    assert count_parameters(PAPER) == 24_210_800  # "24M" (Table 1); torch's LSTM adds a second bias: 24,221,600


def test_the_solver_picks_the_hidden_size_for_a_budget():
    shape = replace(PAPER, hidden_size=1)
    paper = solve_hidden_size(shape, 24_210_800)
    assert (paper.hidden_size, paper.embedding_size) == (1150, 400)
    solved = solve_hidden_size(shape, 24_000_000)
    assert (solved.hidden_size, solved.embedding_size, count_parameters(solved)) == (1144, 398, 23_981_688)
    assert count_parameters_by_building(solved) == 23_981_688  # the closed form counts what is built
    assert count_parameters(replace(solved, hidden_size=1145)) > 24_000_000


def test_layers_narrow_to_the_embedding_which_feeds_the_tied_softmax_without_a_projection():
    model = model_of(tiny())
    assert isinstance(model, AWDLanguageModel) and model.projection is None
    assert [(layer.cell.input.in_features, layer.cell.hidden_size) for layer in model.layers] == [(6, 12), (12, 12),
                                                                                                  (12, 6)]
    assert [h.shape for h, _ in model.initial_state(4)] == [(4, 12), (4, 12), (4, 6)]
    logits, state = model(tokens(), model.initial_state(4))
    assert logits.shape == (6, 4, 30) and [h.shape[1] for h, _ in state] == [12, 12, 6]
    assert layer_sizes(tiny(num_layers=1)) == [(6, 6)]
    mixture = model_of(tiny(softmax_components=2, tie_embeddings=False, residual_connections=True))
    assert mixture.mixture.latent.in_features == 6 and mixture.output_embedding.shape == (30, 6)
    assert mixture(tokens(), mixture.initial_state(4))[0].logsumexp(-1).allclose(torch.zeros(6, 4), atol=1e-5)


def test_a_sized_layer_has_what_a_recurrent_layer_has():
    sized, plain = RecurrentLayer(tiny(), 0, sizes=(6, 12)), RecurrentLayer(tiny(), 0)
    assert (sized.cell.input.in_features, sized.cell.hidden_size) == (6, 12)
    assert vars(sized).keys() == vars(plain).keys() and sized._modules.keys() == plain._modules.keys()


def test_initialisation_is_the_papers():
    model = model_of(replace(PAPER, vocab_size=50, hidden_size=64, input_embedding_ratio=0.25))
    assert model.embedding.weight.abs().max() <= 0.1 and model.embedding.weight.std() > 0.05
    assert torch.equal(model.output_bias, torch.zeros(50))
    for layer in model.layers:
        bound = 1 / math.sqrt(layer.cell.hidden_size)
        for weight in (layer.cell.input.weight, layer.cell.recurrent.weight):
            assert weight.abs().max() <= bound and weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
        assert layer.cell.input.bias.abs().max() <= 2 * bound  # the sum of torch's two bias vectors


def _recurrent_weights_seen(model: LanguageModel, window: torch.Tensor
                            ) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """For each layer, the hidden-to-hidden matrix each step of the window used (on the reference path, which calls
    the matrix's module once a step), and the logits."""
    seen: list[list[torch.Tensor]] = [[] for _ in model.layers]
    hooks = []
    for index, layer in enumerate(model.layers):
        layer.fast = False
        hooks.append(layer.cell.recurrent.register_forward_pre_hook(
            lambda module, args, index=index: seen[index].append(module.weight.detach().clone())))
    dtype = model.output_bias.dtype
    state = [(h.to(dtype), c.to(dtype)) for h, c in model.initial_state(window.shape[1])]
    logits, _ = model(window, state)
    for hook in hooks:
        hook.remove()
    return seen, logits


def test_weight_drop_is_one_mask_per_window_and_off_in_evaluation():
    model = model_of(tiny(weight_drop=0.5))
    (first, _), (second, _) = (_recurrent_weights_seen(model, tokens(steps=5)) for _ in range(2))
    for layer, steps, next_window in zip(model.layers, first, second, strict=True):
        raw = layer.cell.recurrent.weight.detach()
        assert len(steps) == 5 and all(torch.equal(step, steps[0]) for step in steps)
        dropped = steps[0] == 0
        assert 0.3 < dropped.float().mean() < 0.7  # about half of the weights
        torch.testing.assert_close(steps[0][~dropped], 2 * raw[~dropped])  # kept ones scaled by 1 / (1 - 0.5)
        assert not torch.equal(next_window[0] == 0, dropped)  # a new mask for the next window
    model.eval()
    for layer, steps in zip(model.layers, _recurrent_weights_seen(model, tokens(steps=3))[0], strict=True):
        assert all(torch.equal(step, layer.cell.recurrent.weight) for step in steps)


def test_weight_drop_on_the_fast_path_matches_the_reference_path_and_its_gradient_is_masked():
    window = tokens()
    torch.manual_seed(1)
    fast = model_of(tiny(weight_drop=0.5)).double()
    fast(window, [(h.double(), c.double()) for h, c in fast.initial_state(4)])[0].sum().backward()
    torch.manual_seed(1)  # the same masks on both paths
    reference = model_of(tiny(weight_drop=0.5)).double()
    seen, logits = _recurrent_weights_seen(reference, window)
    logits.sum().backward()
    for (name, a), b in zip(fast.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10, msg=name)
    for layer, steps in zip(fast.layers, seen, strict=True):
        gradient, kept = layer.cell.recurrent.weight.grad, steps[0] != 0
        assert torch.all(gradient[~kept] == 0) and torch.all(gradient[kept] != 0)


def test_dropout_is_locked_over_the_window_and_drawn_per_sequence():
    model = model_of(tiny(input_dropout=0.5, output_dropout=0.5, ar_alpha=1.0))
    with torch.no_grad():
        model.embedding.weight.fill_(1.0)  # every word's vector is ones: the layer sees the mask itself
    inputs = []
    model.layers[0].register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    model(tokens(), model.initial_state(4))
    mask = inputs[0]
    assert all(torch.equal(step, mask[0]) for step in mask) and (mask[0] == 0).any()
    assert not torch.equal(mask[0, 0], mask[0, 1])  # each sequence has its own mask
    raw, dropped = model.take_last_layer_outputs()
    kept = dropped[0] != 0
    assert all(torch.equal(dropped[t] != 0, kept) for t in range(6)) and not kept.all()
    torch.testing.assert_close(dropped[:, kept], 2 * raw[:, kept])
    assert model.take_last_layer_outputs() is None  # taken once: the model holds no graph afterwards


def test_the_last_layer_outputs_are_kept_only_to_be_regularised():
    window = tokens()
    for config, training in ((tiny(ar_alpha=0.0, tar_beta=0.0), True), (tiny(tar_beta=1.0), False),
                             (replace(tiny(), family="lstm", input_embedding_ratio=1.0), True)):
        model = model_of(config).train(training)
        model(window, model.initial_state(4))
        assert model.take_last_layer_outputs() is None
    model = model_of(tiny(tar_beta=1.0))
    with torch.no_grad():
        model(window, model.initial_state(4))
    assert model.take_last_layer_outputs() is None


def test_regularisers_belong_to_the_family_that_declares_them():
    with pytest.raises(ValueError, match=r"weight_drop: got 0.5; allowed: 0 for family 'lstm' \(use family "
                                         r"'awd_lstm'\)"):
        ModelConfig(vocab_size=10, hidden_size=4, weight_drop=0.5)
    with pytest.raises(ValueError, match=r"tar_beta: got 1.0; allowed: 0 for family 'mogrifier'"):
        ModelConfig(vocab_size=10, hidden_size=4, family="mogrifier", tar_beta=1.0)
    with pytest.raises(ValueError, match=r"weight_drop: got 1.0; allowed: a rate in \[0, 1\)"):
        tiny(weight_drop=1.0)
    with pytest.raises(ValueError, match=r"ar_alpha: got -1.0; allowed: a number >= 0"):
        tiny(ar_alpha=-1.0)
    assert ModelConfig.from_dict(PAPER.to_dict()) == PAPER
