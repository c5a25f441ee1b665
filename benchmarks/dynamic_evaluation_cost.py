"""The cost of dynamic evaluation relative to a static evaluation pass over the same text.

One model (our LSTM at `--parameter-budget`, or a checkpoint), one text: a fixed prefix of the PTB
validation split (`--tokens`). Timed, `--repeats` times each, alternating so machine load hits both:
- static: `lm_tuner.trainers.cross_entropy` at batch size 1, in windows of `max_time_steps` tokens, the same
  segments dynamic evaluation scores (and, for information, in windows of 100 tokens as the test
  protocol reads a split);
- dynamic: `lm_tuner.trainers.dynamic_cross_entropy` exactly as the project runs it (score each segment, then
  one update), with the gradient-RMS statistics (`lm_tuner.trainers.gradient_rms`) computed once beforehand
  and timed separately;
- gradients only: the same segments' forward and backward passes without the update, a floor under
  any implementation of the update (exact dynamic evaluation needs every segment's full gradient);
- matrix-multiply FLOPs of one segment, forward alone against forward and full gradient: the floor
  in arithmetic, whatever the implementation.
The ratio reported is the median dynamic time over the median static time (same segments). Speed
does not depend on the weights, so an untrained model measures the same cost as a trained one.

    PYTHONPATH=. python benchmarks/dynamic_evaluation_cost.py --data /path/to/ptb --output dyneval_cost.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.cell_throughput import describe_machine, emit_json
from lm_tuner.models import LanguageModel, ModelConfig, count_parameters, detach_state, solve_hidden_size
from lm_tuner.trainers import (
    Corpus,
    DynamicEvaluationConfig,
    cross_entropy,
    dataset_from_dict,
    dynamic_cross_entropy,
    gradient_rms,
    load_checkpoint,
    load_corpus,
)
from lm_tuner.trainers.batching import batchify, windows
from lm_tuner.trainers.dynamic_evaluation import embedding_lookups_as_leaves
from lm_tuner.trainers.evaluation import evaluation_mode
from lm_tuner.trainers.heap import keep_freed_memory
from lm_tuner.trainers.objective import token_nll

TEST_PROTOCOL_BPTT = 100
STATISTICS_BATCH, STATISTICS_BPTT, STATISTICS_WINDOWS = 64, 35, 20


def timed(function: Callable[[], float]) -> tuple[float, float]:
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


def build_model(corpus: Corpus, checkpoint: Path | None, parameter_budget: int) -> LanguageModel:
    if checkpoint is not None:
        return load_checkpoint(checkpoint).model
    torch.manual_seed(0)
    config = solve_hidden_size(ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=1, num_layers=1),
                               parameter_budget)
    return LanguageModel(config).eval()


def gradients_only(model: LanguageModel, text: Tensor, segment: int) -> float:
    """Every segment's loss and full gradient, computed as dynamic evaluation does, without updates."""
    params, total, count = list(model.parameters()), 0.0, 0
    state = model.initial_state(1)
    with evaluation_mode(model), embedding_lookups_as_leaves(model) as lookups:
        for inputs, targets in windows(batchify(text, 1), segment):
            logits, state = model(inputs, detach_state(state))
            nll = token_nll(logits, targets)
            torch.autograd.grad(nll.mean(), [*params, lookups.pop()], allow_unused=True)
            total, count = total + nll.sum().item(), count + nll.numel()
    return total / count


def matmul_flops(model: LanguageModel, text: Tensor, segment: int) -> dict[str, int]:
    """Matrix-multiply FLOPs of one segment: its forward alone, and its forward and full gradient
    (counted on the reference path, whose matrix multiplies torch's FLOP counter sees)."""
    inputs, targets = text[:segment].view(-1, 1), text[1 : segment + 1].view(-1, 1)
    state, params = model.initial_state(1), list(model.parameters())
    fast = [layer.fast for layer in model.layers]
    counted: dict[str, int] = {}
    try:
        for layer in model.layers:
            layer.fast = False
        with evaluation_mode(model):
            with FlopCounterMode(display=False) as counter, torch.no_grad():
                model(inputs, state)
            counted["static"] = counter.get_total_flops()
            with FlopCounterMode(display=False) as counter:
                logits, _ = model(inputs, state)
                torch.autograd.grad(token_nll(logits, targets).mean(), params)
            counted["gradients"] = counter.get_total_flops()
    finally:
        for layer, was_fast in zip(model.layers, fast, strict=True):
            layer.fast = was_fast
    return counted


def measure(model: LanguageModel, corpus: Corpus, tokens: int, repeats: int,
            config: DynamicEvaluationConfig) -> dict[str, Any]:
    text = corpus.valid[:tokens]
    statistics_seconds, rms = timed(lambda: gradient_rms(model, corpus.train, batch_size=STATISTICS_BATCH,
                                                         bptt=STATISTICS_BPTT, max_windows=STATISTICS_WINDOWS))
    passes: dict[str, Callable[[], float]] = {
        "static_same_segments": lambda: cross_entropy(model, text, 1, config.max_time_steps),
        "static_test_protocol_windows": lambda: cross_entropy(model, text, 1, TEST_PROTOCOL_BPTT),
        "dynamic": lambda: dynamic_cross_entropy(model, text, rms, config),
        "gradients_only": lambda: gradients_only(model, text, config.max_time_steps),
    }
    seconds: dict[str, list[float]] = {name: [] for name in passes}
    losses: dict[str, float] = {}
    for _ in range(repeats):
        for name, run in passes.items():
            elapsed, losses[name] = timed(run)
            seconds[name].append(elapsed)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    flops = matmul_flops(model, text, config.max_time_steps)
    return {
        "tokens": int(text.numel()),
        "gradient_rms_seconds": statistics_seconds,
        "gradient_rms_setup": dict(batch_size=STATISTICS_BATCH, bptt=STATISTICS_BPTT, windows=STATISTICS_WINDOWS),
        "seconds": seconds,
        "median_seconds": median,
        "loss_nats": losses,
        "ratio_dynamic_to_static": median["dynamic"] / median["static_same_segments"],
        "ratio_dynamic_to_static_test_protocol_windows": median["dynamic"] / median["static_test_protocol_windows"],
        "ratio_gradients_only_to_static": median["gradients_only"] / median["static_same_segments"],
        "matmul_flops_per_segment": flops,
        "ratio_matmul_flops_gradients_to_static": flops["gradients"] / flops["static"],
    }


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="folder with ptb.train.txt, ptb.valid.txt, ptb.test.txt")
    parser.add_argument("--checkpoint", type=Path, help="a model checkpoint to time instead of a fresh LSTM")
    parser.add_argument("--parameter-budget", type=int, default=4_000_000,
                        help="size of the fresh 1-layer LSTM (default 4M, as in ptb_short.py)")
    parser.add_argument("--tokens", type=int, default=5_000, help="validation prefix to evaluate (default 5000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes of each kind (default 5)")
    parser.add_argument("--max-time-steps", type=int, default=DynamicEvaluationConfig().max_time_steps,
                        help="dynamic-evaluation segment length (default: the project's default)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--output", type=Path, help="write the JSON here (it is always printed)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    arguments = parse_arguments(argv)
    torch.set_num_threads(arguments.threads)
    heap_kept = keep_freed_memory()  # as trial and evaluation jobs run (tuner.trial.configure_torch)
    corpus = load_corpus(dataset_from_dict({"path": str(Path(arguments.data).resolve()), "format": "ptb"}))
    model = build_model(corpus, arguments.checkpoint, arguments.parameter_budget)
    config = DynamicEvaluationConfig(max_time_steps=arguments.max_time_steps)
    load_before = os.getloadavg()
    result = measure(model, corpus, arguments.tokens, arguments.repeats, config)
    output = {
        "benchmark": "dynamic_evaluation_cost",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": describe_machine(torch.device("cpu"), torch.get_num_threads())
        | {"load_average_before": load_before, "load_average_after": os.getloadavg(), "freed_memory_kept": heap_kept},
        "model": dict(model.config.to_dict(), parameters=count_parameters(model.config)),
        "dynamic_evaluation": config.model_dump(),
        **result,
    }
    emit_json(output, arguments.output, indent=1)
    return output


if __name__ == "__main__":
    main(sys.argv[1:])
