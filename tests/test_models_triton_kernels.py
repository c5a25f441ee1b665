"""The Triton kernels (fused mogrifier, LSTM update) against the reference path.

On a GPU the kernels run compiled. Without one, Triton's interpreter runs them on CPU tensors; it is
chosen by TRITON_INTERPRET when the kernels are defined, so those checks run in a subprocess.
Shapes cover unequal x and h widths, a rank below the 16 that a tile holds, odd and even round
counts, odd batches, the state-dropout mask, and chunks narrower than a program's threads (24 columns
for 512 threads), where copies of a column's gradient race in the backward kernel unless it waits
between reading and writing them: a race only the compiled run can show.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lm_tuner.models import LanguageModel, ModelConfig
from lm_tuner.models.mogrifier_window import MAX_FUSED_RANK, FusedWindow, fused_kernel_serves
from lm_tuner.models.recurrence import RecurrentLayer, variational_mask
from lm_tuner.models.tape import Tape, autograd_linear
from lm_tuner.models.triton_support import TRITON_AVAILABLE

if TRITON_AVAILABLE:
    from lm_tuner.models import lstm_kernels

needs_triton = pytest.mark.skipif(not TRITON_AVAILABLE, reason="needs Triton (installed with the test extras)")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHAPES = [  # family, rounds, rank, input size, hidden size, batch, masked, capped input gate
    ("mogrifier", 5, 5, 24, 24, 20, True, True),
    ("mogrifier_rlstm", 4, 3, 17, 24, 3, False, True),
    ("mogrifier", 1, 5, 24, 70, 33, True, False),
    ("mogrifier", 6, 20, 40, 40, 16, False, True),
    ("lstm", 0, 0, 24, 300, 5, True, True),
    ("mlstm", 0, 0, 17, 24, 6, False, False),
]
# The interpreter runs the kernels' programs one after another, one per batch row: the same shapes with at most 5
# rows (an odd batch stays odd) take a fifth of the time (125 s for both launches before).
INTERPRETED_SHAPES = [(*shape[:5], min(shape[5], 4 + shape[5] % 2), *shape[6:]) for shape in SHAPES]
FUSED_MOGRIFIER = {"mogrifier", "mogrifier_rlstm"}
FUSED_LSTM_UPDATE = {"mogrifier", "lstm", "mlstm"}


def relative_errors(family: str, rounds: int, rank: int, input_size: int, hidden: int, batch: int, masked: bool,
                    cap: bool, device: str) -> list[float]:
    """‖fused − reference‖ / ‖reference‖ of outputs, last state and every gradient of one float32 window."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=10, hidden_size=hidden, family=family, mogrifier_rounds=rounds,
                         mogrifier_rank=rank, input_embedding_ratio=input_size / hidden, cap_input_gate=cap)
    layer = RecurrentLayer(config, 0).to(device)
    inputs = torch.randn(5, batch, input_size, device=device)
    h, c = torch.randn(batch, hidden, device=device), torch.randn(batch, hidden, device=device).clamp(-1, 1)
    mask = variational_mask(batch, hidden, 0.3, inputs) if masked else None

    def outputs_and_grads(fast: bool) -> list[torch.Tensor]:
        layer.fast = fast
        leaves = [t.detach().requires_grad_() for t in (inputs, h, c)]
        outputs, (h_last, c_last) = layer(leaves[0], (leaves[1], leaves[2]), mask)
        weights = torch.linspace(-1, 1, outputs.numel(), device=device).view_as(outputs)
        loss = (outputs * weights).sum() + 0.3 * h_last.sum() + 0.7 * c_last.sum()
        return [outputs, h_last, c_last, *torch.autograd.grad(loss, [*leaves, *layer.parameters()])]

    calls = []
    counted = [(FusedWindow, "forward"), (FusedWindow, "backward")]
    if family in FUSED_LSTM_UPDATE:
        counted += [(lstm_kernels, "lstm_update"), (lstm_kernels, "lstm_update_backward")]
    originals = [getattr(owner, name) for owner, name in counted]
    for (owner, name), original in zip(counted, originals, strict=True):
        setattr(owner, name, lambda *args, name=name, original=original: (calls.append(name), original(*args))[1])
    try:
        fused = outputs_and_grads(True)
    finally:
        for (owner, name), original in zip(counted, originals, strict=True):
            setattr(owner, name, original)
    steps = inputs.shape[0]
    assert calls.count("forward") == calls.count("backward") == (steps if family in FUSED_MOGRIFIER else 0)
    if family in FUSED_LSTM_UPDATE:
        assert calls.count("lstm_update") == calls.count("lstm_update_backward") == steps
    reference = outputs_and_grads(False)
    return [((a - b).norm() / b.norm()).item() for a, b in zip(fused, reference, strict=True)]


@needs_triton
@pytest.mark.parametrize("tile", [None, 256], ids=["default-launch", "narrow-chunks"])
def test_interpreted_kernels_match_the_reference_path(tile):
    """With the default launch every test shape's columns fit one chunk; a tile of 256 elements makes chunks of 16
    columns at these ranks, so that each pass walks several chunks, the last one ragged."""
    narrow = "" if tile is None else f"mogrifier_window.LAUNCH = dict(mogrifier_window.LAUNCH, TILE={tile})\n"
    script = (
        "import json, sys\n"
        "from lm_tuner.models import mogrifier_window\n"
        f"{narrow}"
        "from tests.test_models_triton_kernels import INTERPRETED_SHAPES, relative_errors\n"
        "print(json.dumps([max(relative_errors(*shape, device='cpu')) for shape in INTERPRETED_SHAPES]))\n"
    )
    root = Path(__file__).resolve().parent.parent
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    output = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=600,
                            env=os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": path})
    assert output.returncode == 0, output.stderr
    worst = json.loads(output.stdout.strip().splitlines()[-1])
    assert len(worst) == len(INTERPRETED_SHAPES)
    assert max(worst) < 1e-5, worst


@cuda
@needs_triton
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[0]}-r{s[1]}-k{s[2]}-{s[3]}x{s[4]}-b{s[5]}" for s in SHAPES])
def test_compiled_kernels_match_the_reference_path(shape):
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # exact float32 products on both paths
    try:
        assert max(relative_errors(*shape, device="cuda")) < 1e-5
    finally:
        torch.set_float32_matmul_precision(previous)


@cuda
@needs_triton
def test_tf32_kernels_stay_close_to_the_reference_path():
    """With TF32 allowed, both paths round cuBLAS products to 10-bit mantissas (the reference its mogrifier's too):
    close, not equal (the worst of the window's values and gradients was 1.1e-2 on an H200 with torch 2.11 and the
    earlier, TF32, mogrifier kernels)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        assert max(relative_errors("mogrifier", 5, 40, 512, 512, 32, True, True, device="cuda")) < 3e-2
    finally:
        torch.set_float32_matmul_precision(previous)


@cuda
@needs_triton
def test_full_rank_double_and_evaluation_windows_take_the_fused_kernels_only_where_they_serve():
    model = LanguageModel(ModelConfig(vocab_size=10, hidden_size=32, family="mogrifier", mogrifier_rounds=3,
                                      mogrifier_rank=4)).cuda()
    mogrifier, inputs = model.layers[0].mogrifier, torch.randn(3, 2, 32, device="cuda")
    assert fused_kernel_serves(mogrifier, Tape(), inputs)
    assert fused_kernel_serves(mogrifier, Tape(record=False), inputs)
    assert not fused_kernel_serves(mogrifier, autograd_linear, inputs)
    assert not fused_kernel_serves(mogrifier, Tape(), inputs.double())
    full_rank = LanguageModel(ModelConfig(vocab_size=10, hidden_size=32, family="mogrifier", mogrifier_rounds=3,
                                          mogrifier_rank=0)).cuda()
    assert not fused_kernel_serves(full_rank.layers[0].mogrifier, Tape(), inputs)


def test_the_fused_mogrifier_serves_low_ranks_up_to_its_rank_limit(monkeypatch):
    monkeypatch.setattr("lm_tuner.models.mogrifier_window.triton_serves", lambda *tensors: True)
    inputs = torch.randn(3, 2, 8)

    def mogrifier(rank: int):
        config = ModelConfig(vocab_size=10, hidden_size=8, family="mogrifier", mogrifier_rounds=2, mogrifier_rank=rank)
        return RecurrentLayer(config, 0).mogrifier

    assert fused_kernel_serves(mogrifier(MAX_FUSED_RANK), Tape(), inputs)
    assert not fused_kernel_serves(mogrifier(MAX_FUSED_RANK + 1), Tape(), inputs)
    assert not fused_kernel_serves(mogrifier(0), Tape(), inputs)  # full rank
    assert not fused_kernel_serves(mogrifier(4), autograd_linear, inputs)  # the reference path
