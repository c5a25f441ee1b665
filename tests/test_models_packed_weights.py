"""The tape's per-step products with weights packed once per window (models/tape.py) against unpacked ones.

Packing only changes the layout oneDNN reads the weight in, so values and gradients match the unpacked
products to float32 rounding; tests/test_models_fast_path.py checks the same shapes against the reference path.
"""

import pytest
import torch

from lm_tuner.models import tape
from tests.test_models_fast_path import layer_of, outputs_and_grads, window_of

needs_onednn = pytest.mark.skipif(not tape._ONEDNN, reason="this torch build has no oneDNN linear")
RECURRENT = ["lstm", "rlstm", "mlstm", "mogrifier", "mogrifier_rlstm"]


def _counting_packs(monkeypatch) -> list[tuple[int, ...]]:
    packed_shapes = []
    original = tape._packed

    def counting(inputs, weight):
        packed = original(inputs, weight)
        if packed is not None:
            packed_shapes.append(tuple(weight.shape))
        return packed
    monkeypatch.setattr(tape, "_packed", counting)
    return packed_shapes


@needs_onednn
@pytest.mark.parametrize("family", RECURRENT)
def test_packed_products_match_unpacked_ones(family, monkeypatch):
    monkeypatch.setattr(tape, "_PREFER_MKL", False)
    torch.manual_seed(0)
    rounds = 3 if family.startswith("mogrifier") else 0
    layer = layer_of(family, rounds, 16, True, input_size=160, hidden=160, dtype=torch.float32)  # 3H x H > 2^16
    window = window_of(6, 8, 160, 160, torch.float32, masked=True)
    packed_shapes = _counting_packs(monkeypatch)
    packed = outputs_and_grads(layer, True, *window)
    recurrent = tuple(layer.cell.recurrent.weight.shape)
    assert recurrent in packed_shapes  # forward: the recurrent weight
    assert recurrent[::-1] in packed_shapes  # backward: its transpose
    monkeypatch.setattr(tape, "_packed", lambda inputs, weight: None)
    unpacked = outputs_and_grads(layer, True, *window)
    for a, b in zip(packed, unpacked, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@needs_onednn
def test_a_window_of_one_step_packs_nothing(monkeypatch):
    """Packing costs about one product: a weight is packed on its second use in a window, never for one step.
    (A one-step window's input gradient once came back without its time axis: it is checked here too.)"""
    monkeypatch.setattr(tape, "_PREFER_MKL", False)  # on Intel the backward's products take MKL, unpacked
    torch.manual_seed(0)
    layer = layer_of("lstm", 0, 0, True, input_size=128, hidden=128, dtype=torch.float32)
    packed_shapes = _counting_packs(monkeypatch)
    outputs_and_grads(layer, True, *window_of(1, 8, 128, 128, torch.float32, masked=False))
    assert packed_shapes == []
    outputs_and_grads(layer, True, *window_of(2, 8, 128, 128, torch.float32, masked=False))
    assert len(packed_shapes) == 2


def test_small_or_double_precision_weights_are_never_packed():
    weight = torch.randn(512, 128)
    assert tape._packed(torch.randn(8, 128), weight) is not None or not tape._ONEDNN
    assert tape._packed(torch.randn(8, 128, dtype=torch.float64), weight.double()) is None
    assert tape._packed(torch.randn(8, 16), torch.randn(64, 16)) is None  # below oneDNN's threshold
    assert tape._packed(torch.randn(1, 128), weight) is None  # one row: evaluation's matrix-vector products


@pytest.mark.parametrize("family", RECURRENT)
def test_a_window_of_one_step_matches_the_reference(family):
    torch.manual_seed(0)
    rounds = 2 if family.startswith("mogrifier") else 0
    layer = layer_of(family, rounds, 3, True, input_size=12, hidden=16, dtype=torch.float64)
    window = window_of(1, 5, 12, 16, torch.float64, masked=True)
    for a, b in zip(*(outputs_and_grads(layer, fast, *window) for fast in (True, False)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
