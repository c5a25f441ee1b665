"""Where a training step's time goes: torch.profiler over cell_throughput's language models, family by family.

Each model (torch.nn.LSTM's and ours, the same shapes as benchmarks/cell_throughput.py's word-level setup)
takes two untimed steps (kernels built, CUDA graphs captured), then `--steps` profiled training steps
(forward, cross-entropy, backward). Reported per model: wall seconds per step, and the operators or
kernels with the most self time per step (device time on a GPU, CPU time on a CPU) with their share
of the profiled total. On a GPU the kernels replayed from a CUDA graph are listed one by one.

    PYTHONPATH=. python benchmarks/step_profile.py --device cuda --output benchmarks/results/step_profile_gpu.json
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.cell_throughput import (
    FAMILY_FIELDS,
    REFERENCE,
    WORD,
    OurLanguageModel,
    TorchLSTMLanguageModel,
    describe_machine,
    emit_json,
    synchronize,
    training_step,
)

GRAPH_REPLAYS = {"Graphed", "GraphedBackward"}
"""Autograd's wrappers of CUDA graph replays: their device time is that of the kernels they replay, listed too."""


def profile_step(step: Any, device: torch.device, steps: int, top: int) -> dict[str, Any]:
    """Wall seconds per step, then the `top` entries by self time per step in a profiled run of `steps` steps."""
    for _ in range(2):
        step()
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    wall = (time.perf_counter() - started) / steps

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        synchronize(device)
    time_of = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [event for event in profiler.key_averages()
              if getattr(event, time_of) > 0 and event.key not in GRAPH_REPLAYS]
    total = sum(getattr(event, time_of) for event in events)
    ranked = sorted(events, key=lambda event: getattr(event, time_of), reverse=True)[:top]
    return {
        "wall_seconds_per_step": wall,
        "profiled_microseconds_per_step": total / steps,
        "time": "device" if device.type == "cuda" else "cpu",
        "top": [{"name": event.key[:120], "calls_per_step": event.count / steps,
                 "microseconds_per_step": getattr(event, time_of) / steps,
                 "share": getattr(event, time_of) / total} for event in ranked],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--families", nargs="+", default=list(FAMILY_FIELDS), choices=list(FAMILY_FIELDS))
    parser.add_argument("--steps", type=int, default=5, help="profiled training steps per model")
    parser.add_argument("--top", type=int, default=12, help="entries listed per model")
    parser.add_argument("--output", type=Path, help="write the JSON result here (also printed)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)

    tokens = torch.randint(WORD.vocab_size, (WORD.bptt, WORD.batch), device=device)
    models = {REFERENCE: TorchLSTMLanguageModel()} | {family: OurLanguageModel(family) for family in args.families}
    profiles = {name: profile_step(training_step(model.to(device), tokens, tokens), device, args.steps, args.top)
                for name, model in models.items()}
    reference_wall = profiles[REFERENCE]["wall_seconds_per_step"]
    for entry in profiles.values():
        entry["wall_vs_reference"] = entry["wall_seconds_per_step"] / reference_wall
    emit_json({
        "benchmark": "step_profile",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": describe_machine(device, args.threads),
        "setup": {"vocab_size": WORD.vocab_size, "batch": WORD.batch, "bptt": WORD.bptt, "steps": args.steps,
                  "float32_matmul_precision": "high",
                  "step": "forward + cross-entropy + backward of the whole language model (no optimizer update)"},
        "profiles": profiles,
    }, args.output)


if __name__ == "__main__":
    main()
