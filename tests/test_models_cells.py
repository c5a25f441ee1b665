"""The cells against docs/methodology.md#model-families: equations, the input-gate cap, the Mogrifier,
initialisation."""

import math

import pytest
import torch

from lm_tuner.models import LanguageModel, ModelConfig
from lm_tuner.models.cells import LSTMCell, MLSTMCell, RLSTMCell
from lm_tuner.models.mogrifier import GateProjection, Mogrifier
from lm_tuner.models.recurrence import RecurrentLayer
from lm_tuner.models.tape import autograd_linear

BATCH, INPUT, HIDDEN = 4, 5, 6
sigma, tanh = torch.sigmoid, torch.tanh


def _random_step_inputs(scale: float = 1.0, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x, h, c = (scale * torch.randn(BATCH, size, generator=generator) for size in (INPUT, HIDDEN, HIDDEN))
    return x, h, c.clamp(-1, 1)


def _step(cell, x, h, c, state_mask=None):
    h, c, _ = cell.step(autograd_linear, autograd_linear(cell.input, x), h, c, state_mask)
    return h, c


def _blocks(weight, count):
    return weight.chunk(count, dim=0)


@pytest.mark.parametrize("cap", [True, False])
def test_lstm_step_follows_the_equations(cap):
    cell = LSTMCell(INPUT, HIDDEN, cap_input_gate=cap)
    x, h_prev, c_prev = _random_step_inputs()
    w_ix, w_fx, w_ox, w_jx = _blocks(cell.input.weight, 4)
    w_ih, w_fh, w_oh, w_jh = _blocks(cell.recurrent.weight, 4)
    b_i, b_f, b_o, b_j = _blocks(cell.input.bias, 4)
    i = sigma(x @ w_ix.T + h_prev @ w_ih.T + b_i)
    j = tanh(x @ w_jx.T + h_prev @ w_jh.T + b_j)
    f = sigma(x @ w_fx.T + h_prev @ w_fh.T + b_f)
    o = sigma(x @ w_ox.T + h_prev @ w_oh.T + b_o)
    c = f * c_prev + (torch.minimum(i, 1 - f) if cap else i) * j
    h, c_step = _step(cell, x, h_prev, c_prev)
    torch.testing.assert_close(c_step, c)
    torch.testing.assert_close(h, o * tanh(c))


@pytest.mark.parametrize("masked", [False, True])
def test_rlstm_step_follows_the_equations(masked):
    cell = RLSTMCell(INPUT, HIDDEN)
    x, h_prev, c_prev = _random_step_inputs()
    mask = torch.bernoulli(torch.full((BATCH, HIDDEN), 0.5)) * 2 if masked else None
    h_seen = h_prev if mask is None else h_prev * mask
    (w_ix, w_jx), (w_ih, w_jh, w_fh) = _blocks(cell.input.weight, 2), _blocks(cell.recurrent.weight, 3)
    b_i, b_j = _blocks(cell.input.bias, 2)
    i = sigma(x @ w_ix.T + h_seen @ w_ih.T + b_i)
    j = tanh(x @ w_jx.T + h_seen @ w_jh.T + b_j)
    f = sigma((i * j) @ cell.forget.weight.T + h_seen @ w_fh.T + cell.forget.bias)
    c = f * c_prev + torch.minimum(i, 1 - f) * j
    o = sigma((c if mask is None else c * mask) @ cell.output.weight.T + cell.output.bias)
    h, c_step = _step(cell, x, h_seen, c_prev, mask)
    torch.testing.assert_close(c_step, c)
    torch.testing.assert_close(h, o * tanh(c))


def test_mlstm_step_follows_the_equations():
    cell = MLSTMCell(INPUT, HIDDEN, cap_input_gate=False)
    x, h_prev, c_prev = _random_step_inputs()
    w_ix, w_fx, w_ox, w_jx, w_mx = _blocks(cell.input.weight, 5)
    (w_im, w_fm, w_om, w_jm), (b_i, b_f, b_o, b_j) = _blocks(cell.recurrent.weight, 4), _blocks(cell.recurrent.bias, 4)
    m = (x @ w_mx.T) * (h_prev @ cell.hidden_factor.weight.T)
    i, f, o = (sigma(x @ w.T + m @ u.T + b) for w, u, b in ((w_ix, w_im, b_i), (w_fx, w_fm, b_f), (w_ox, w_om, b_o)))
    c = f * c_prev + i * tanh(x @ w_jx.T + m @ w_jm.T + b_j)
    h, c_step = _step(cell, x, h_prev, c_prev)
    torch.testing.assert_close(c_step, c)
    torch.testing.assert_close(h, o * tanh(c))


@pytest.mark.parametrize("cell_type", [RLSTMCell, LSTMCell, MLSTMCell])
def test_capped_cells_keep_the_cell_state_within_one(cell_type):
    torch.manual_seed(0)
    cell = cell_type(INPUT, HIDDEN, cap_input_gate=True)
    with torch.no_grad():
        for parameter in cell.parameters():
            parameter.mul_(4.0)  # saturate the gates
        h, c = torch.zeros(BATCH, HIDDEN), torch.zeros(BATCH, HIDDEN)
        largest = 0.0
        for step in range(300):
            x, _, _ = _random_step_inputs(scale=5.0, seed=step)
            h, c = _step(cell, x, h, c)
            largest = max(largest, c.abs().max().item())
    assert largest <= 1.0


def test_the_uncapped_lstm_cell_state_does_exceed_one():
    torch.manual_seed(0)
    cell = LSTMCell(INPUT, HIDDEN, cap_input_gate=False)
    with torch.no_grad():
        cell.input.bias.add_(5.0)  # input and forget gates near 1: c accumulates
        h, c = torch.zeros(BATCH, HIDDEN), torch.zeros(BATCH, HIDDEN)
        for step in range(50):
            h, c = _step(cell, _random_step_inputs(seed=step)[0], h, c)
    assert c.abs().max().item() > 1.0


def _language_model_outputs(config: ModelConfig, seed: int = 0):
    torch.manual_seed(seed)
    model = LanguageModel(config)
    tokens = torch.randint(config.vocab_size, (7, 3), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(seed + 1)
    logits, state = model(tokens, model.initial_state(3))
    return model, logits, state


@pytest.mark.parametrize(("plain", "mogrified"), [("lstm", "mogrifier"), ("rlstm", "mogrifier_rlstm")])
def test_zero_mogrifier_rounds_is_the_plain_cell_bit_for_bit(plain, mogrified):
    fields = dict(vocab_size=11, hidden_size=8, input_embedding_ratio=0.5, state_dropout=0.3, output_dropout=0.2)
    plain_model, plain_logits, plain_state = _language_model_outputs(ModelConfig(family=plain, **fields))
    mog_model, mog_logits, mog_state = _language_model_outputs(ModelConfig(family=mogrified, mogrifier_rank=3,
                                                                           **fields))
    assert plain_model.state_dict().keys() == mog_model.state_dict().keys()
    for name, tensor in plain_model.state_dict().items():
        assert torch.equal(tensor, mog_model.state_dict()[name]), name
    assert torch.equal(plain_logits, mog_logits)
    assert all(torch.equal(a, b) for a, b in zip(plain_state[-1], mog_state[-1], strict=True))


@pytest.mark.parametrize("rank", [0, 2])
def test_zero_mogrifier_weights_make_the_mogrifier_the_identity(rank):
    mogrifier = Mogrifier(INPUT, HIDDEN, rounds=5, rank=rank)
    with torch.no_grad():
        for parameter in mogrifier.parameters():
            parameter.zero_()
    x, h, _ = _random_step_inputs()
    x_out, h_out, _ = mogrifier(autograd_linear, x, h)
    assert torch.equal(x_out, x) and torch.equal(h_out, h)

    config = ModelConfig(vocab_size=11, hidden_size=HIDDEN, family="mogrifier", mogrifier_rounds=4, mogrifier_rank=rank)
    layer = RecurrentLayer(config, layer=1)
    plain = RecurrentLayer(ModelConfig(vocab_size=11, hidden_size=HIDDEN), layer=1)
    plain.cell.load_state_dict(layer.cell.state_dict())
    with torch.no_grad():
        for parameter in layer.mogrifier.parameters():
            parameter.zero_()
    inputs, state = torch.randn(5, BATCH, HIDDEN), (torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN))
    torch.testing.assert_close(layer(inputs, state)[0], plain(inputs, state)[0], rtol=0, atol=1e-6)


def test_mogrifier_gates_x_first_then_h_from_the_updated_x():
    mogrifier = Mogrifier(INPUT, HIDDEN, rounds=3, rank=0)
    q1, r2, q3 = (projection.maps[0] for projection in mogrifier.projections)
    x, h, _ = _random_step_inputs()
    x1 = 2 * sigma(h @ q1.weight.T + q1.bias) * x
    h2 = 2 * sigma(x1 @ r2.weight.T + r2.bias) * h
    x3 = 2 * sigma(h2 @ q3.weight.T + q3.bias) * x1
    x_out, h_out, _ = mogrifier(autograd_linear, x, h)
    torch.testing.assert_close(x_out, x3)
    torch.testing.assert_close(h_out, h2)


def test_each_layer_has_its_own_mogrifier():
    model = LanguageModel(ModelConfig(vocab_size=11, hidden_size=6, family="mogrifier", num_layers=3,
                                      mogrifier_rounds=2))
    mogrifiers = [layer.mogrifier for layer in model.layers]
    assert len({id(m) for m in mogrifiers}) == 3
    weights = [m.projections[0].maps[0].weight for m in mogrifiers]
    assert len({w.data_ptr() for w in weights}) == 3


def test_low_rank_projection_is_a_product_of_two_factors():
    projection = GateProjection(source=HIDDEN, target=INPUT, rank=2)
    right, left = projection.maps
    assert right.weight.shape == (2, HIDDEN) and left.weight.shape == (INPUT, 2) and right.bias is None
    h = torch.randn(BATCH, HIDDEN)
    torch.testing.assert_close(projection(autograd_linear, h), h @ (left.weight @ right.weight).T + left.bias)


def test_language_model_initialisation():
    """The cells' and the mogrifier's initialisation is tested in tests/test_models_initialisation.py."""
    hidden = 64
    model = LanguageModel(ModelConfig(vocab_size=50, hidden_size=hidden, input_embedding_ratio=0.5))
    assert torch.count_nonzero(model.output_bias) == 0
    projection = model.projection.weight  # orthogonal rows
    torch.testing.assert_close(projection @ projection.T, torch.eye(hidden // 2), rtol=0, atol=1e-5)


@pytest.mark.parametrize("cell_type", [LSTMCell, RLSTMCell, MLSTMCell])
def test_chrono_init_draws_forget_biases_from_log_uniform(cell_type):
    t_max = math.e**4
    torch.manual_seed(0)
    cell = cell_type(8, 256, chrono_t_max=t_max)
    forget_bias = {LSTMCell: lambda c: c.input.bias[256:512], RLSTMCell: lambda c: c.forget.bias,
                   MLSTMCell: lambda c: c.recurrent.bias[256:512]}[cell_type](cell)
    assert forget_bias.min().item() >= 0.0 and forget_bias.max().item() <= math.log(t_max - 1)
    torch.testing.assert_close(forget_bias.exp().mean().item(), (1 + t_max - 1) / 2, rtol=0.1, atol=0)
