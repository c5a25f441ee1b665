"""Initialisation at the reference scale (docs/methodology.md#initialisation): every weight tile of every cell and
every full-rank mogrifier matrix has effective std sqrt(1/fan-in) under a normal truncated at 2 sigma; mogrifier
biases are zero; low-rank mogrifier factors keep the reference's uncorrected (1/(fan-in k))^(1/4).

Sizes are large enough for a 5% tolerance on a standard deviation to be many standard errors wide: a tile of
512 x 384 entries estimates its std to about 0.15%."""

import math

import pytest
import torch

from lm_tuner.models.cells import LSTMCell, MLSTMCell, RLSTMCell
from lm_tuner.models.initialisation import PRE_TRUNCATION_STD_FACTOR, TRUNCATION, init_tile_, pre_truncation_std
from lm_tuner.models.mogrifier import GateProjection, Mogrifier

INPUT, HIDDEN = 384, 512  # unequal, so that a tile drawn with the other side's fan-in is 15% off
TOLERANCE = 0.05


def _rows(weight, count):
    return dict(enumerate(weight.chunk(count, dim=0)))


def _weight_tiles(cell):
    """(name, tile, fan-in) of every weight tile: W_x tiles read x (fan-in m), all others a vector of size n."""
    if isinstance(cell, LSTMCell):
        blocks = {"W_x": (cell.input.weight, 4, INPUT), "W_h": (cell.recurrent.weight, 4, HIDDEN)}
    elif isinstance(cell, RLSTMCell):
        blocks = {"W_x": (cell.input.weight, 2, INPUT), "W_h": (cell.recurrent.weight, 3, HIDDEN),
                  "W_fu": (cell.forget.weight, 1, HIDDEN), "W_oc": (cell.output.weight, 1, HIDDEN)}
    else:
        blocks = {"W_x": (cell.input.weight, 5, INPUT), "W_mh": (cell.hidden_factor.weight, 1, HIDDEN),
                  "W_m": (cell.recurrent.weight, 4, HIDDEN)}
    return [(f"{name}[{k}]", tile, fan_in) for name, (weight, count, fan_in) in blocks.items()
            for k, tile in _rows(weight, count).items()]


def _biases(cell):
    """(gate biases other than the forget gate's, the forget gate's bias)."""
    if isinstance(cell, LSTMCell):
        gates = cell.input.bias.chunk(4)  # i, f, o, j
        return torch.cat([gates[0], *gates[2:]]), gates[1]
    if isinstance(cell, RLSTMCell):
        return torch.cat([cell.input.bias, cell.output.bias]), cell.forget.bias
    gates = cell.recurrent.bias.chunk(4)
    return torch.cat([gates[0], *gates[2:]]), gates[1]


def _assert_reference_draws(name, values, std, mean=0.0):
    """Draws of a normal with mean `mean`, effective std `std`, truncated at 2 pre-truncation stds."""
    values = values.detach().double()
    assert abs(values.std().item() / std - 1) < TOLERANCE, (name, values.std().item(), std)
    assert abs(values.mean().item() - mean) < 5 * std / math.sqrt(values.numel()), (name, values.mean().item())
    assert (values - mean).abs().max().item() <= TRUNCATION * pre_truncation_std(std) + 1e-6, name


def test_pre_truncation_factor_matches_a_sampled_truncated_normal():
    draws = torch.randn(4_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kept = draws[draws.abs() <= TRUNCATION]  # N(0, 1) truncated at +-2 by rejection, independent of the formula
    assert abs(kept.std().item() * PRE_TRUNCATION_STD_FACTOR - 1) < 2e-3  # the std estimate's error is ~2e-4
    assert PRE_TRUNCATION_STD_FACTOR == pytest.approx(1.1368, abs=1e-4)
    assert PRE_TRUNCATION_STD_FACTOR**2 == pytest.approx(1.3, rel=0.006)  # the reference's rounded variance factor
    assert pre_truncation_std(0.5) == pytest.approx(0.5 * PRE_TRUNCATION_STD_FACTOR)


def test_init_tile_draws_the_wanted_std_and_mean():
    torch.manual_seed(0)
    tile = init_tile_(torch.empty(512, 512), fan_in=200, mean=1.0)
    _assert_reference_draws("tile", tile, math.sqrt(1 / 200), mean=1.0)
    with pytest.raises(ValueError, match="fan_in must be a positive size, got 0"):
        init_tile_(torch.empty(3), fan_in=0)


@pytest.mark.parametrize("cell_type", [LSTMCell, RLSTMCell, MLSTMCell])
def test_every_weight_tile_has_std_sqrt_one_over_its_fan_in(cell_type):
    torch.manual_seed(0)
    cell = cell_type(INPUT, HIDDEN)
    tiles = _weight_tiles(cell)
    assert sum(tile.numel() for _, tile, _ in tiles) == sum(
        p.numel() for name, p in cell.named_parameters() if name.endswith("weight"))
    for name, tile, fan_in in tiles:
        _assert_reference_draws(name, tile, math.sqrt(1 / fan_in))


@pytest.mark.parametrize("cell_type", [LSTMCell, RLSTMCell, MLSTMCell])
def test_biases_have_std_sqrt_one_over_n_and_the_forget_bias_mean_one(cell_type):
    torch.manual_seed(0)
    cells = [cell_type(8, HIDDEN) for _ in range(4)]  # pooled: a single bias tile has only n entries
    gate_biases, forget_biases = (torch.cat(parts) for parts in zip(*map(_biases, cells), strict=True))
    _assert_reference_draws("gate biases", gate_biases, math.sqrt(1 / HIDDEN))
    _assert_reference_draws("forget bias", forget_biases, math.sqrt(1 / HIDDEN), mean=1.0)


def test_full_rank_mogrifier_matrices_use_the_cell_initialiser_per_fan_in_and_zero_biases():
    torch.manual_seed(0)
    mogrifier = Mogrifier(INPUT, HIDDEN, rounds=4, rank=0)
    sources = [HIDDEN, INPUT, HIDDEN, INPUT]  # odd rounds (1-based) gate x from h, even ones h from x
    for k, (projection, source) in enumerate(zip(mogrifier.projections, sources, strict=True)):
        (linear,) = projection.maps
        assert linear.in_features == source
        _assert_reference_draws(f"round {k + 1}", linear.weight, math.sqrt(1 / source))
        assert torch.count_nonzero(linear.bias) == 0


def test_low_rank_mogrifier_factors_keep_the_reference_scale_and_zero_biases():
    torch.manual_seed(0)
    source, target, rank = HIDDEN, INPUT, 64
    right, left = GateProjection(source, target, rank).maps
    factor_std = (1 / (source * rank)) ** 0.25  # pre-truncation, uncorrected, as in the reference
    for name, factor in (("right", right.weight), ("left", left.weight)):
        _assert_reference_draws(name, factor, factor_std / PRE_TRUNCATION_STD_FACTOR)
    assert torch.count_nonzero(left.bias) == 0
