"""How much a validation score depends on where its tokens come from and on how many streams they are cut into.

Tuning may score only a subset of the validation split after each turn (`training.validation_tokens`). Every
evaluation stream starts from a zero state, so a subset cut into many short streams scores worse than the same
tokens read as one stream; and a stretch of text can simply be harder than the whole split. This trains one small
LSTM on PTB for a fixed number of steps (the project's trainer, the ptb_short settings), then scores stretches of the
validation split (the first, a middle and the last 10,000 tokens, and all of it) as 1, 4, 32 and 100 parallel
streams, and records each perplexity and how long it took. `trainers.validation_cut.SUBSET_STREAM_TOKENS` is chosen
from this.

    PYTHONPATH=. .venv/bin/python benchmarks/validation_streams.py --data ~/.cache/lm-tuner/datasets/ptb \
        --output benchmarks/results/validation_streams_cpu.json
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from benchmarks.cell_throughput import emit_json
from benchmarks.ptb_short import OUR_MODEL_FIELDS, load_ptb, machine, set_threads
from lm_tuner.models import ModelConfig
from lm_tuner.models.budget import solve_hidden_size
from lm_tuner.trainers import Schedule, TrainingConfig, load_checkpoint, train
from lm_tuner.trainers.evaluation import cross_entropy

STREAMS = (1, 4, 32, 100)
BPTT = 35


def stretches(valid: torch.Tensor, tokens: int) -> dict[str, torch.Tensor]:
    tokens = min(tokens, valid.numel() // 3)
    middle = valid.numel() // 2 - tokens // 2
    return {"first": valid[:tokens], "middle": valid[middle:middle + tokens], "last": valid[-tokens:],
            "whole split": valid}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="folder with ptb.train.txt, ptb.valid.txt, ptb.test.txt")
    parser.add_argument("--steps", type=int, default=800, help="training steps before scoring (default 800)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--stretch-tokens", type=int, default=10_000,
                        help="tokens of the first, middle and last stretch (default 10000)")
    parser.add_argument("--parameter-budget", type=int, default=4_000_000, help="the LSTM's budget (default 4M)")
    parser.add_argument("--output", type=Path, help="write the JSON here (it is always printed)")
    arguments = parser.parse_args(argv)
    set_threads(arguments.threads)
    corpus = load_ptb(arguments.data)
    fields = OUR_MODEL_FIELDS["lstm"] | {"tie_embeddings": False, "input_embedding_ratio": 0.35}
    model_config = solve_hidden_size(ModelConfig(vocab_size=len(corpus.vocabulary), hidden_size=1, **fields),
                                     arguments.parameter_budget)
    schedule = Schedule(budget_steps=arguments.steps, steps_per_turn=arguments.steps, batch_size=32, bptt=BPTT,
                        eval_batch_size=1, validation_tokens=2 * (BPTT + 1), search_temperature=False)
    with tempfile.TemporaryDirectory() as folder:
        best = Path(folder) / "best.pt"
        train(model_config, TrainingConfig(schedule=schedule, learning_rate=0.004), corpus, checkpoint_path=best,
              device=torch.device("cpu"))
        model = load_checkpoint(best).model
    scores = []
    for name, tokens in stretches(corpus.valid, arguments.stretch_tokens).items():
        for streams in (count for count in STREAMS if tokens.numel() // count > BPTT):  # a window per stream
            started = time.perf_counter()
            loss = cross_entropy(model, tokens, streams, BPTT)
            scores.append({"stretch": name, "tokens": int(tokens.numel()), "streams": streams,
                           "tokens_per_stream": int(tokens.numel()) // streams, "perplexity": math.exp(loss),
                           "seconds": time.perf_counter() - started})
    one_stream = {score["stretch"]: score["perplexity"] for score in scores if score["streams"] == 1}
    for score in scores:
        score["ratio_to_one_stream"] = score["perplexity"] / one_stream[score["stretch"]]
    output = {"benchmark": "validation_streams", "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "machine": machine(arguments.threads),
              "settings": {"steps": arguments.steps, "model": model_config.to_dict(), "bptt": BPTT,
                           "learning_rate": 0.004, "batch_size": 32},
              "scores": scores}
    emit_json(output, arguments.output, indent=1)
    return output


if __name__ == "__main__":
    main()
