"""Whole windows in C++ (models/lstm_window.py: LSTM, mogrifier LSTM, mLSTM; models/rlstm_window.py: RLSTM,
mogrifier RLSTM) against the reference path and the Python loop.

In float64 the window kernels agree with the reference (autograd) path to rounding. In float32 they run the
same products as the Python loop of the fast path (oneDNN with packed weights at these sizes), so the two
agree to float32 rounding.
"""

import pytest
import torch

from lm_tuner.models import cpu_kernels, lstm_window, rlstm_window
from tests.test_models_fast_path import counting_calls, layer_of, outputs_and_grads, window_of

needs_kernel = pytest.mark.skipif(cpu_kernels.cpu_extension() is None,
                                  reason="the C++ kernels could not be built here (see the warning)")
CASES = [  # family, mogrifier rounds, rank, capped input gate, state mask, steps, batch
    ("lstm", 0, 0, True, True, 5, 3),
    ("lstm", 0, 0, False, False, 1, 4),
    ("mogrifier", 5, 3, True, True, 4, 6),
    ("mogrifier", 2, 4, False, False, 3, 1),
    ("mogrifier", 1, 2, True, True, 1, 5),
    ("mlstm", 0, 0, True, True, 4, 3),
    ("mlstm", 0, 0, False, False, 1, 2),
    ("rlstm", 0, 0, True, True, 5, 3),
    ("rlstm", 0, 0, False, True, 4, 1),
    ("rlstm", 0, 0, True, False, 1, 4),
    ("mogrifier_rlstm", 5, 3, True, True, 4, 6),
    ("mogrifier_rlstm", 2, 4, False, False, 3, 1),
    ("mogrifier_rlstm", 1, 2, True, True, 1, 5),
]
IDS = [f"{c[0]}-r{c[1]}-cap{c[3]}-mask{c[4]}-t{c[5]}-b{c[6]}" for c in CASES]
FAMILIES = ["lstm", "mogrifier", "mlstm", "rlstm", "mogrifier_rlstm"]


def window_module(family):
    """The module whose `forward` and `backward` run the family's window in C++."""
    return rlstm_window if family.endswith("rlstm") else lstm_window


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("family", "rounds", "rank", "cap", "masked", "steps", "batch"), CASES, ids=IDS)
def test_window_kernels_match_the_reference_path(family, rounds, rank, cap, masked, steps, batch, threads,
                                                 monkeypatch):
    calls = counting_calls(monkeypatch, window_module(family))
    torch.manual_seed(0)
    layer = layer_of(family, rounds, rank, cap, input_size=7, hidden=9, dtype=torch.float64)
    window = window_of(steps, batch, 7, 9, torch.float64, masked)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = outputs_and_grads(layer, True, *window)
    finally:
        torch.set_num_threads(previous)
    assert calls == ["forward", "backward"]
    for a, b in zip(fast, outputs_and_grads(layer, False, *window), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@needs_kernel
@pytest.mark.parametrize("family", FAMILIES)
def test_window_kernels_match_the_python_loop_in_single_precision(family, monkeypatch):
    """At these sizes both take oneDNN with packed weights (4H x H >= 2^16, 8 rows; the RLSTM's H x H forget
    and output weights at H = 256), but for the mLSTM's H x H factor, which the Python loop multiplies by with
    at::mm and the window kernel then multiplies all its weights by: they differ by float32 rounding."""
    torch.manual_seed(0)
    rounds = 3 if family.startswith("mogrifier") else 0
    hidden = 256 if family.endswith("rlstm") else 128
    layer = layer_of(family, rounds, 16, True, input_size=128, hidden=hidden, dtype=torch.float32)
    window = window_of(6, 8, 128, hidden, torch.float32, masked=True)
    calls = counting_calls(monkeypatch, window_module(family))
    in_cpp = outputs_and_grads(layer, True, *window)
    assert calls == ["forward", "backward"]
    monkeypatch.setattr(lstm_window, "window_kernels", lambda *args: None)
    in_python = outputs_and_grads(layer, True, *window)
    for a, b in zip(in_cpp, in_python, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("family", FAMILIES)
def test_evaluation_windows_match_the_recorded_forward(family):
    torch.manual_seed(0)
    rounds = 2 if family.startswith("mogrifier") else 0
    layer = layer_of(family, rounds, 3, True, input_size=7, hidden=9, dtype=torch.float32)
    inputs, h, c, mask = window_of(4, 3, 7, 9, torch.float32, masked=True)
    with torch.no_grad():
        evaluated, (h_last, c_last) = layer(inputs, (h, c), mask)
    trained, (h_trained, c_trained) = layer(inputs.requires_grad_(), (h, c), mask)
    for a, b in ((evaluated, trained), (h_last, h_trained), (c_last, c_trained)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_kernel
@pytest.mark.parametrize("family", ["mogrifier", "mogrifier_rlstm"])
def test_full_rank_mogrifiers_keep_the_python_loop(family, monkeypatch):
    calls = [counting_calls(monkeypatch, module) for module in (lstm_window, rlstm_window)]
    layer = layer_of(family, 2, 0, True, input_size=7, hidden=9, dtype=torch.float64)
    outputs_and_grads(layer, True, *window_of(3, 2, 7, 9, torch.float64, masked=False))
    assert calls == [[], []]


@needs_kernel
@pytest.mark.parametrize("family", FAMILIES)
def test_gradcheck_window_kernels(family):
    torch.manual_seed(0)
    rounds = 3 if family.startswith("mogrifier") else 0
    layer = layer_of(family, rounds, 2, True, input_size=4, hidden=5, dtype=torch.float64)
    inputs, h, c, mask = window_of(3, 2, 4, 5, torch.float64, masked=True)

    def run(inputs, h, c):
        outputs, (h_last, c_last) = layer(inputs, (h, c), mask)
        return outputs, h_last, c_last
    assert torch.autograd.gradcheck(run, tuple(t.requires_grad_() for t in (inputs, h, c)))
