"""The language model: configuration, layer combination, output layers, the dropout family, evaluation modes."""

import pytest
import torch

from lm_tuner.models import FAMILIES, LanguageModel, ModelConfig, detach_state, monte_carlo_dropout
from lm_tuner.models import family as registered_family

VOCAB, HIDDEN, STEPS, BATCH = 13, 8, 6, 4


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(VOCAB, (STEPS, BATCH), generator=torch.Generator().manual_seed(seed))


def _model(seed: int = 0, **fields) -> LanguageModel:
    torch.manual_seed(seed)
    return LanguageModel(ModelConfig(vocab_size=VOCAB, hidden_size=HIDDEN, **fields))


def _logits(model, tokens=None, seed=None):
    if seed is not None:
        torch.manual_seed(seed)
    tokens = _tokens() if tokens is None else tokens
    return model(tokens, model.initial_state(tokens.shape[1]))[0]


@pytest.mark.parametrize("family", [name for name in FAMILIES if registered_family(name).cell != "transformer"])
def test_every_recurrent_family_builds_and_carries_a_list_of_states(family):
    model = _model(family=family, mogrifier_rounds=2 if family.startswith("mogrifier") else 0, num_layers=3)
    logits, state = model(_tokens(), model.initial_state(BATCH))
    assert logits.shape == (STEPS, BATCH, VOCAB)
    assert len(state) == 3 and all(t.shape == (BATCH, HIDDEN) for layer_state in state for t in layer_state)
    assert all(len(layer_state) == (1 if family.endswith("gru") else 2) for layer_state in state)  # (h,) or (h, c)
    assert not any(t.requires_grad for layer_state in detach_state(state) for t in layer_state)


def test_configuration_errors_name_the_field_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"family: got 'elman'; allowed: lstm, mogrifier, rlstm, mogrifier_rlstm"):
        ModelConfig(vocab_size=10, hidden_size=4, family="elman")
    with pytest.raises(ValueError, match=r"mogrifier_rounds: got 2; allowed: 0 for family 'rlstm'"):
        ModelConfig(vocab_size=10, hidden_size=4, family="rlstm", mogrifier_rounds=2)
    with pytest.raises(ValueError, match=r"mogrifier_rounds: got 7; allowed: an integer in \[0, 6\]"):
        ModelConfig(vocab_size=10, hidden_size=4, family="mogrifier", mogrifier_rounds=7)
    with pytest.raises(ValueError, match=r"chrono_t_max: got 1.5; allowed: 0 \(forget bias mean 1\) or a number > 2"):
        ModelConfig(vocab_size=10, hidden_size=4, chrono_t_max=1.5)
    with pytest.raises(ValueError, match=r"softmax_components: got 0; allowed: an integer >= 1"):
        ModelConfig(vocab_size=10, hidden_size=4, softmax_components=0)
    with pytest.raises(ValueError, match=r"cell_output_dropout: got 1.0; allowed: a rate in \[0, 1\)"):
        ModelConfig(vocab_size=10, hidden_size=4, cell_output_dropout=1.0)


def test_configuration_round_trips_through_plain_data():
    config = ModelConfig(vocab_size=10, hidden_size=4, family="mogrifier_rlstm", mogrifier_rounds=3, mogrifier_rank=2,
                         residual_connections=True, softmax_components=2, chrono_t_max=20.0, embedding_dropout=0.1)
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert config.cell == "rlstm"


def test_residual_and_skip_connections_coincide_for_two_layers_and_differ_for_three():
    fields = dict(inter_layer_dropout=0.3, cell_output_dropout=0.2, output_dropout=0.1)
    skip, residual = _model(**fields), _model(residual_connections=True, **fields)
    torch.testing.assert_close(_logits(skip, seed=5), _logits(residual, seed=5), rtol=0, atol=0)
    skip, residual = _model(num_layers=3), _model(num_layers=3, residual_connections=True)
    assert not torch.allclose(_logits(skip), _logits(residual))


def test_residual_layers_read_the_sum_of_all_layers_below():
    model = _model(num_layers=3, residual_connections=True).eval()
    seen = []
    for layer in model.layers:
        layer.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    outputs = []
    for layer in model.layers:
        layer.register_forward_hook(lambda module, args, result: outputs.append(result[0]))
    _logits(model)
    torch.testing.assert_close(seen[1], outputs[0])
    torch.testing.assert_close(seen[2], outputs[0] + outputs[1])


def test_embeddings_are_tied_for_words_and_untied_for_characters():
    tied, untied = _model(), _model(tie_embeddings=False)
    assert tied.output_embedding is None
    assert untied.output_embedding.shape == (VOCAB, HIDDEN)
    assert untied.output_embedding.data_ptr() != untied.embedding.weight.data_ptr()


def test_a_small_embedding_gets_a_projection_and_a_ratio_of_one_or_more_does_not():
    assert _model(input_embedding_ratio=1.7).projection is None
    small = _model(input_embedding_ratio=0.5)
    assert small.embedding.weight.shape == (VOCAB, HIDDEN // 2)
    assert small.projection.weight.shape == (HIDDEN // 2, HIDDEN) and small.projection.bias is None


def test_mixture_of_softmaxes_returns_normalised_log_probabilities():
    model = _model(softmax_components=3, input_embedding_ratio=0.5).eval()
    log_probs = _logits(model)
    torch.testing.assert_close(log_probs.logsumexp(-1), torch.zeros(STEPS, BATCH))
    single = _model(input_embedding_ratio=0.5).eval()
    assert not torch.allclose(_logits(single).log_softmax(-1), log_probs)


def test_evaluation_is_deterministic():
    model = _model(family="mogrifier", mogrifier_rounds=3, input_dropout=0.5, state_dropout=0.5, output_dropout=0.5,
                   embedding_dropout=0.3, cell_output_dropout=0.3, inter_layer_dropout=0.3).eval()
    assert torch.equal(_logits(model, seed=1), _logits(model, seed=2))


def test_monte_carlo_dropout_samples_masks_and_scales_rates():
    model = _model(input_dropout=0.5, state_dropout=0.5, output_dropout=0.5).eval()
    deterministic = _logits(model)
    with torch.no_grad(), monte_carlo_dropout(model, 0.8):
        assert model.training
        first, second = _logits(model, seed=1), _logits(model, seed=2)
    assert not model.training and model.dropout_multiplier == 1.0
    assert not torch.allclose(first, second)
    with monte_carlo_dropout(model, 0.0):
        assert torch.equal(_logits(model, seed=3), deterministic)
    with pytest.raises(ValueError, match="multiplier: got -1; allowed: a number >= 0"), monte_carlo_dropout(model, -1):
        pass


def test_state_dropout_draws_one_mask_per_sequence_per_window():
    model = _model(state_dropout=0.5, num_layers=1).train()
    masks = []
    model.layers[0].register_forward_pre_hook(lambda module, args: masks.append(args[2]))
    tokens = _tokens().repeat(1, 8)  # 32 sequences
    for _ in range(2):
        model(tokens, model.initial_state(tokens.shape[1]))
    first, second = masks
    assert first.shape == (32, HIDDEN)  # no time dimension: one mask for the whole window
    assert set(first.unique().tolist()) <= {0.0, 2.0}
    assert len({tuple(row.tolist()) for row in first}) > 1  # sequences get different masks
    assert not torch.equal(first, second)  # the next window draws again


def test_the_state_mask_is_the_same_at_every_step_of_the_window():
    model = _model(family="mogrifier_rlstm", mogrifier_rounds=2, num_layers=1)
    layer = model.layers[0]
    inputs, h, c = torch.randn(STEPS, BATCH, HIDDEN), torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)
    mask = torch.bernoulli(torch.full((BATCH, HIDDEN), 0.5)) * 2
    window_outputs, _ = layer(inputs, (h, c), mask)
    for step in range(STEPS):  # one step at a time, handing the same mask to every step
        step_output, (h, c) = layer(inputs[step : step + 1], (h, c), mask)
        torch.testing.assert_close(step_output[0], window_outputs[step])
    unmasked_outputs, _ = layer(inputs, (torch.randn(BATCH, HIDDEN), c), None)
    assert not torch.allclose(unmasked_outputs, window_outputs)


def test_state_dropout_masks_h_inside_the_step_but_carries_it_unmasked():
    model = _model(num_layers=1)
    layer = model.layers[0]
    inputs, h, c = torch.randn(1, BATCH, HIDDEN), torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)
    mask = torch.bernoulli(torch.full((BATCH, HIDDEN), 0.5)) * 2
    masked_outputs, (h_next, _) = layer(inputs, (h, c), mask)
    same_outputs, _ = layer(inputs, (h * mask, c), None)
    torch.testing.assert_close(masked_outputs, same_outputs)
    torch.testing.assert_close(h_next, masked_outputs[-1])


def test_embedding_dropout_removes_whole_words():
    model = _model(embedding_dropout=0.5).train()
    seen = []
    model.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    tokens = torch.tensor([[1, 1, 2, 2], [1, 2, 1, 2]])
    model(tokens, model.initial_state(4))
    vectors = seen[0]
    for word in (1, 2):
        kept = [bool(vectors[t, b].abs().sum() > 0) for t, b in (tokens == word).nonzero().tolist()]
        assert len(set(kept)) == 1  # every occurrence of a word is dropped or kept together
        if kept[0]:
            torch.testing.assert_close(vectors[tokens == word][0], 2 * model.embedding.weight[word])


@pytest.mark.parametrize("rate", ["input_dropout", "inter_layer_dropout", "cell_output_dropout", "output_dropout"])
def test_each_dropout_rate_changes_training_outputs_only(rate):
    base = _model(input_embedding_ratio=0.5)
    dropped = _model(input_embedding_ratio=0.5, **{rate: 0.5})
    assert torch.equal(_logits(base.eval()), _logits(dropped.eval()))
    assert not torch.allclose(_logits(base.train(), seed=0), _logits(dropped.train(), seed=0))


def test_output_dropout_applies_again_after_the_projection():
    model = _model(input_embedding_ratio=0.5, output_dropout=0.5).train()
    seen = []
    model.projection.register_forward_hook(lambda module, args, result: seen.append(result))
    logits = _logits(model, seed=0)
    projected = seen[0].reshape(-1, HIDDEN // 2)
    # logits = dropout(projected) @ E.T + b, and E has full column rank: recover what reached the softmax
    reached = torch.linalg.lstsq(model.embedding.weight, (logits - model.output_bias).reshape(-1, VOCAB).T).solution.T
    dropped = reached.abs() < 1e-4
    assert dropped.any() and (~dropped).any()
    torch.testing.assert_close(reached[~dropped], 2 * projected[~dropped], rtol=1e-3, atol=1e-4)
