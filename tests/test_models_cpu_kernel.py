"""The C++ kernels for CPUs (models/csrc/cpu_kernels.cpp) against the reference path.

Mogrifier shapes cover unequal x and h widths, odd and even round counts, batches of one row and batches that
two threads split unevenly, the state-dropout mask, both capped and uncapped input gates, and both
mogrifier families. In float64 the two paths agree to rounding; in float32 the kernel's matrix
multiplies run per slice of rows, so sums are ordered differently.
"""

from pathlib import Path

import pytest
import torch

from lm_tuner.models import ModelConfig, cells, cpu_kernels, lstm_window
from lm_tuner.models.mogrifier_window import CpuKernelWindow, ReferenceWindow, cpu_kernel_serves, mogrifier_window
from lm_tuner.models.recurrence import RecurrentLayer
from lm_tuner.models.tape import Tape, autograd_linear
from tests.test_models_fast_path import counting_calls, layer_of, outputs_and_grads, window_of

SHAPES = [  # family, rounds, rank, input size, hidden size, batch, masked, capped input gate
    ("mogrifier", 5, 5, 24, 24, 20, True, True),
    ("mogrifier_rlstm", 4, 3, 17, 24, 3, False, True),
    ("mogrifier", 1, 5, 24, 70, 33, True, False),
    ("mogrifier", 6, 20, 40, 40, 1, False, True),
]
SHAPE_IDS = [f"{s[0]}-r{s[1]}-k{s[2]}-{s[3]}x{s[4]}-b{s[5]}" for s in SHAPES]

needs_kernel = pytest.mark.skipif(cpu_kernels.cpu_extension() is None,
                                  reason="the C++ kernel could not be built here (see the warning)")


def _layer_and_window(family, rounds, rank, input_size, hidden, batch, masked, cap, dtype):
    torch.manual_seed(0)
    return (layer_of(family, rounds, rank, cap, input_size, hidden, dtype),
            window_of(5, batch, input_size, hidden, dtype, masked))


@needs_kernel
@pytest.mark.parametrize("window_in_cpp", [True, False], ids=["window-in-cpp", "steps-in-python"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-10), (torch.float32, 1e-5)], ids=["f64", "f32"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_the_kernel_matches_the_reference_path(shape, dtype, tolerance, threads, window_in_cpp, monkeypatch):
    """Every mogrifier family's window loops in C++ (models/lstm_window.py, models/rlstm_window.py), which calls
    the kernel's C++ side; with that loop off, the Python loop calls it step by step."""
    calls = counting_calls(monkeypatch, CpuKernelWindow)
    if not window_in_cpp:
        monkeypatch.setattr(lstm_window, "window_kernels", lambda *args: None)
    layer, window = _layer_and_window(*shape, dtype=dtype)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = outputs_and_grads(layer, True, *window)
    finally:
        torch.set_num_threads(previous)
    in_python = 0 if window_in_cpp else window[0].shape[0]
    assert calls.count("forward") == calls.count("backward") == in_python
    reference = outputs_and_grads(layer, False, *window)
    for a, b in zip(fast, reference, strict=True):
        assert ((a - b).norm() / b.norm()).item() < tolerance


@needs_kernel
def test_without_an_exported_blas_the_rounds_take_at_mm_with_the_same_numbers(monkeypatch, tmp_path):
    """Where torch exports no BLAS (its builds without MKL) the rounds' products go through at::mm; a build that
    defines LM_TUNER_NO_EXPORTED_BLAS takes that path here. Both paths, and both precisions, match the reference."""
    monkeypatch.setattr(cpu_kernels, "FLAGS", [*cpu_kernels.FLAGS, "-DLM_TUNER_NO_EXPORTED_BLAS"])
    # a library of another name: loading one named as the process's default build would return that one
    monkeypatch.setattr(cpu_kernels, "EXTENSION_NAME", "lm_tuner_cpu_kernels_without_exported_blas")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    cpu_kernels.cpu_extension.cache_clear()
    try:
        assert Path(cpu_kernels.cpu_extension().__file__).parent.parent.parent == tmp_path
        for dtype, tolerance in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
            layer, window = _layer_and_window(*SHAPES[0], dtype=dtype)
            fast, reference = (outputs_and_grads(layer, fast, *window) for fast in (True, False))
            for a, b in zip(fast, reference, strict=True):
                assert ((a - b).norm() / b.norm()).item() < tolerance
    finally:
        cpu_kernels.cpu_extension.cache_clear()


@needs_kernel
def test_evaluation_windows_take_the_kernel_and_match_the_recorded_forward(monkeypatch):
    calls = counting_calls(monkeypatch, CpuKernelWindow)
    monkeypatch.setattr(lstm_window, "window_kernels", lambda *args: None)  # steps in Python
    layer, (inputs, h, c, mask) = _layer_and_window(*SHAPES[1], dtype=torch.float32)
    with torch.no_grad():
        evaluated, (h_last, c_last) = layer(inputs, (h, c), mask)
    assert calls == ["forward"] * inputs.shape[0]
    trained, (h_trained, c_trained) = layer(inputs.requires_grad_(), (h, c), mask)
    for a, b in ((evaluated, trained), (h_last, h_trained), (c_last, c_trained)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@needs_kernel
def test_the_kernel_serves_low_rank_cpu_windows_on_the_fast_path_only():
    def mogrifier(rank: int):
        config = ModelConfig(vocab_size=10, hidden_size=8, family="mogrifier", mogrifier_rounds=2, mogrifier_rank=rank)
        return RecurrentLayer(config, 0).mogrifier

    inputs = torch.randn(3, 2, 8)
    assert cpu_kernel_serves(mogrifier(4), Tape(), inputs)
    assert cpu_kernel_serves(mogrifier(4), Tape(record=False), inputs.double())
    assert not cpu_kernel_serves(mogrifier(0), Tape(), inputs)  # full rank
    assert not cpu_kernel_serves(mogrifier(4), autograd_linear, inputs)  # the reference path
    assert not cpu_kernel_serves(mogrifier(4), Tape(), inputs.half())


@needs_kernel
@pytest.mark.parametrize("cap", [True, False])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-12), (torch.float32, 1e-6)], ids=["f64", "f32"])
def test_the_lstm_update_matches_its_pytorch_formulas(dtype, tolerance, cap, monkeypatch):
    """On column slices of wider rows, as the mLSTM passes them; both ways round, caches interchangeable."""
    generator = torch.Generator().manual_seed(0)
    batch, hidden = 5, 7
    x_term = torch.randn(batch, 5 * hidden, dtype=dtype, generator=generator)[:, : 4 * hidden]
    h_term = torch.randn(batch, 4 * hidden, dtype=dtype, generator=generator)
    c_prev, dh, dc = (torch.randn(batch, hidden, dtype=dtype, generator=generator) for _ in range(3))
    kernel_forward = cells.lstm_update(x_term, h_term, c_prev, cap)
    kernel_backward = cells.lstm_update_backward(kernel_forward[2], dh, dc, cap)
    monkeypatch.setattr(cpu_kernels, "serving", lambda *tensors: None)
    python_forward = cells.lstm_update(x_term, h_term, c_prev, cap)
    python_backward = cells.lstm_update_backward(python_forward[2], dh, dc, cap)
    flat = [*kernel_forward[:2], *kernel_forward[2], *kernel_backward]
    expected = [*python_forward[:2], *python_forward[2], *python_backward]
    assert cap == bool((python_forward[2][2] < python_forward[2][0][:, :hidden]).any())  # the cap was taken
    for a, b in zip(flat, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)


@needs_kernel
def test_the_fast_path_takes_the_lstm_update_kernel(monkeypatch):
    calls = []
    for name in ("lstm_update", "lstm_update_backward"):
        original = getattr(cpu_kernels.cpu_extension(), name)
        monkeypatch.setattr(cpu_kernels.cpu_extension(), name,
                            lambda *args, name=name, original=original: (calls.append(name), original(*args))[1])
    # a full-rank mogrifier keeps the per-step loop in Python (plain LSTMs loop in C++: models/lstm_window.py)
    layer, window = _layer_and_window("mogrifier", 2, 0, 6, 6, 3, True, True, dtype=torch.float64)
    fast, reference = (outputs_and_grads(layer, fast, *window) for fast in (True, False))
    assert calls == ["lstm_update"] * 5 + ["lstm_update_backward"] * 5
    for a, b in zip(fast, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_without_a_compiler_the_fast_path_warns_and_keeps_the_per_step_math(monkeypatch, tmp_path):
    def no_compiler(**kwargs):
        raise RuntimeError("Error building extension: c++: not found")

    monkeypatch.setattr("torch.utils.cpp_extension.load", no_compiler)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # where no finished build is
    cpu_kernels.cpu_extension.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="c\\+\\+: not found.*slower PyTorch operations"):
            assert cpu_kernels.cpu_extension() is None
        layer, window = _layer_and_window(*SHAPES[0], dtype=torch.float64)
        assert isinstance(mogrifier_window(layer.mogrifier, Tape(), window[0], window[3]), ReferenceWindow)
        fast, reference = (outputs_and_grads(layer, fast, *window) for fast in (True, False))
        for a, b in zip(fast, reference, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    finally:
        cpu_kernels.cpu_extension.cache_clear()
