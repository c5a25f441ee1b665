"""Time per step of the fused mogrifier kernels (models/mogrifier_kernels.py) under several launch settings.

One layer of the cell_throughput setup (E=H=512, batch 32, BPTT 35, r=5, k=40). Each variant's 35
launches of a window (forward, then backward) are captured in a CUDA graph, as training runs them,
and the graph is replayed; the reference is the per-step PyTorch mogrifier (models.cells.Mogrifier on
a Tape, forward and backward) captured the same way. Needs a CUDA GPU.

    PYTHONPATH=. python benchmarks/mogrifier_kernels.py --output benchmarks/results/mogrifier_kernels_gpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

from benchmarks.cell_throughput import describe_machine
from lm_tuner.models import ModelConfig
from lm_tuner.models.mogrifier_window import LAUNCH, FusedWindow, ReferenceWindow
from lm_tuner.models.recurrence import RecurrentLayer
from lm_tuner.models.tape import Tape

WINDOW, BATCH, SIZE, ROUNDS, RANK = 35, 32, 512, 5, 40
VARIANTS = [dict(TILE=tile, num_warps=warps, num_stages=stages)  # LAUNCH, the default, among them
            for tile, warps, stages in ((8192, 4, 1), (8192, 8, 1), (8192, 8, 3), (16384, 8, 1), (16384, 8, 2),
                                        (16384, 16, 1), (32768, 16, 1), (32768, 32, 1))]


def microseconds_per_step(launch_window: Callable[[], None], replays: int) -> float:
    """Median over replays of a CUDA graph of one window's launches, per step."""
    launch_window()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch_window()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / WINDOW)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--float32-matmul-precision", choices=("highest", "high"), default="high")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_float32_matmul_precision(args.float32_matmul_precision)
    torch.manual_seed(0)
    device = torch.device("cuda")
    config = ModelConfig(vocab_size=10, hidden_size=SIZE, family="mogrifier", mogrifier_rounds=ROUNDS,
                         mogrifier_rank=RANK)
    mogrifier = RecurrentLayer(config, 0).to(device).mogrifier
    inputs = torch.randn(WINDOW, BATCH, SIZE, device=device)
    h, dx, dh = (torch.randn(BATCH, SIZE, device=device) for _ in range(3))

    def window_of(make: Callable[[Tape], FusedWindow | ReferenceWindow]) -> Callable[[], None]:
        def run() -> None:
            tape = Tape()
            window = make(tape)
            for step in range(WINDOW):
                window.forward(step, h)
            backward_tape = tape.for_backward()
            for step in reversed(range(WINDOW)):
                window.backward(backward_tape, step, dx.clone(), dh.clone())
            window.finish_backward(backward_tape)
        return run

    reference = microseconds_per_step(window_of(lambda tape: ReferenceWindow(mogrifier, tape, inputs, None)),
                                      args.replays)
    result = {
        "benchmark": "mogrifier_kernels",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": describe_machine(device, torch.get_num_threads()),
        "setup": {"window": WINDOW, "batch": BATCH, "input_size": SIZE, "hidden_size": SIZE, "rounds": ROUNDS,
                  "rank": RANK, "float32_matmul_precision": args.float32_matmul_precision,
                  "timed": "forward and backward of every step of a window, with buffers and weight packing, "
                           "replayed as one CUDA graph; per step"},
        "reference_microseconds_per_step": reference,
        "fused": [],
    }
    for launch in VARIANTS:  # written after each, so that a run cut short keeps what it measured
        make = lambda tape, launch=launch: FusedWindow(mogrifier, tape, inputs, None, launch)  # noqa: E731
        fused = microseconds_per_step(window_of(make), args.replays)
        result["fused"].append(launch | {"microseconds_per_step": fused, "speedup_vs_reference": reference / fused,
                                         "default": launch == LAUNCH})
        text = json.dumps(result, indent=2)
        if args.output:
            args.output.write_text(text + "\n")
    print(text)

if __name__ == "__main__":
    main()
