"""What freed memory handed back to the kernel costs CPU training and dynamic evaluation.

Each run is a fresh process (spawned), either with glibc's default malloc policy or after
`lm_tuner.trainers.heap.keep_freed_memory()` (what trial and evaluation jobs call at start); runs alternate
so machine load hits both. Workloads, on random tokens (speed does not depend on the text):
- `training_step`: our 1-layer LSTM language model at `--parameter-budget` (V = 10,000), batch 64,
  BPTT 35: forward, cross-entropy, backward, clipping to norm 10 and an Adam step;
- `dynamic_evaluation`: `lm_tuner.trainers.dynamic_cross_entropy` over 1,000 tokens in segments of 5.
Reported per workload: the median seconds per step (per pass), the kernel's minor page faults per
step, and the default policy's time over the kept one's.

    PYTHONPATH=. python benchmarks/heap_reuse.py --output heap_reuse.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from benchmarks.cell_throughput import describe_machine, emit_json
from lm_tuner.models import LanguageModel, ModelConfig, detach_state, solve_hidden_size
from lm_tuner.trainers import DynamicEvaluationConfig, dynamic_cross_entropy
from lm_tuner.trainers.heap import keep_freed_memory
from lm_tuner.trainers.objective import token_nll

VOCAB, BATCH, BPTT, DYNAMIC_TOKENS = 10_000, 64, 35, 1_000
WORKLOADS = ("training_step", "dynamic_evaluation")
POLICIES = ("default", "kept")


def build_model(parameter_budget: int) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(solve_hidden_size(ModelConfig(vocab_size=VOCAB, hidden_size=1, num_layers=1),
                                           parameter_budget))


def training_step(model: LanguageModel) -> Callable[[], None]:
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.0, 0.999))
    tokens = torch.randint(0, VOCAB, (BPTT + 1, BATCH))
    state = model.initial_state(BATCH)

    def step() -> None:
        nonlocal state
        logits, state = model(tokens[:-1], detach_state(state))
        optimizer.zero_grad()
        token_nll(logits, tokens[1:]).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()

    return step


def dynamic_evaluation(model: LanguageModel) -> Callable[[], None]:
    text = torch.randint(0, VOCAB, (DYNAMIC_TOKENS,))
    rms = [torch.ones_like(p) for p in model.parameters()]
    config = DynamicEvaluationConfig(max_time_steps=5)

    def evaluate() -> None:
        dynamic_cross_entropy(model, text, rms, config)

    return evaluate


def run(policy: str, workload: str, steps: int, threads: int, parameter_budget: int) -> dict[str, float]:
    """In a fresh process: seconds per step and minor page faults per step of `workload` under `policy`."""
    torch.set_num_threads(threads)
    if policy == "kept" and not keep_freed_memory():
        raise SystemExit("this C library is not glibc: there is no malloc policy to compare")
    step = {"training_step": training_step, "dynamic_evaluation": dynamic_evaluation}[workload](
        build_model(parameter_budget))
    step()  # warm-up: first-touch allocations, oneDNN primitive caches
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    started = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = (time.perf_counter() - started) / steps
    return {"seconds": seconds, "minor_faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps}


def measure(workload: str, steps: int, repeats: int, threads: int, parameter_budget: int) -> dict[str, Any]:
    spawn = multiprocessing.get_context("spawn")
    runs: dict[str, list[dict[str, float]]] = {policy: [] for policy in POLICIES}
    for _ in range(repeats):
        for policy in POLICIES:
            with spawn.Pool(1) as pool:
                runs[policy].append(pool.apply(run, (policy, workload, steps, threads, parameter_budget)))
    median = {policy: {key: statistics.median(r[key] for r in results) for key in ("seconds", "minor_faults")}
              for policy, results in runs.items()}
    return {
        "steps_per_run": steps,
        "runs": runs,
        "median_seconds_per_step": {policy: m["seconds"] for policy, m in median.items()},
        "median_minor_faults_per_step": {policy: m["minor_faults"] for policy, m in median.items()},
        "speedup_kept_over_default": median["default"]["seconds"] / median["kept"]["seconds"],
    }


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parameter-budget", type=int, default=4_000_000, help="model size (default 4M)")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per run (default 20)")
    parser.add_argument("--passes", type=int, default=2, help="timed dynamic-evaluation passes per run (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each policy per workload (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--output", type=Path, help="write the JSON here (it is always printed)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    arguments = parse_arguments(argv)
    load_before = os.getloadavg()
    steps = {"training_step": arguments.steps, "dynamic_evaluation": arguments.passes}
    results = {workload: measure(workload, steps[workload], arguments.repeats, arguments.threads,
                                 arguments.parameter_budget) for workload in WORKLOADS}
    output = {
        "benchmark": "heap_reuse",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": describe_machine(torch.device("cpu"), arguments.threads)
        | {"load_average_before": load_before, "load_average_after": os.getloadavg()},
        "setup": {"vocab_size": VOCAB, "batch": BATCH, "bptt": BPTT, "dynamic_tokens": DYNAMIC_TOKENS,
                  "parameter_budget": arguments.parameter_budget},
        **results,
    }
    emit_json(output, arguments.output, indent=1)
    return output


if __name__ == "__main__":
    main(sys.argv[1:])
