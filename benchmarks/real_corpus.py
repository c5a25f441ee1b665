"""A real-corpus study on a small machine: LSTM against Mogrifier LSTM on Penn Treebank, through `tuner launch`.

What a researcher with two CPU cores and half an hour gets: the same study a user would write (PTB words, an equal
parameter budget that `tuner plan` shows as sensible, a validation subset during tuning, each family's best
rescored on the whole validation split), run by the real CLI as a subprocess. It writes, per family, every trial
(hyperparameters, subset and full validation perplexity, seconds training and evaluating), the plan's shapes and
warnings, the corpus's unigram perplexity (`tuner data check`) and the study's share of time spent evaluating.

    python benchmarks/real_corpus.py --data /path/to/ptb --output benchmarks/results/real_corpus_cpu_zen4.json

The folder holds ptb.train.txt, ptb.valid.txt and ptb.test.txt (the layout `tuner data check --format ptb` checks).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

FAMILIES = ("lstm", "mogrifier")


def study_spec(data: Path, trial_seconds: float, trials: int) -> dict[str, Any]:
    """LSTM and Mogrifier at 3M parameters: a 2-layer model whose embedding is 0.35 of the hidden size, untied, so
    most parameters are recurrent (ptb_short.py's shape at a smaller budget); a 10k-token validation subset per
    turn keeps evaluation a small share of each trial."""
    return {
        "name": "real-corpus-ptb",
        "description": "LSTM vs Mogrifier LSTM on PTB at 3M parameters, 2 CPU cores (benchmarks/real_corpus.py)",
        "dataset": {"format": "ptb", "path": str(data)},
        "families": list(FAMILIES),
        "parameter_budget": 3_000_000,
        "training": {"budget_seconds": trial_seconds, "clock": "wall", "steps_per_turn": 200, "batch_size": 32,
                     "bptt": 35, "eval_batch_size": 32, "validation_tokens": 10_000,
                     "averaging": {"kind": "2ta"}},
        "fixed": {"num_layers": 2, "input_embedding_ratio": 0.35, "tie_embeddings": False, "mogrifier_rounds": 5,
                  "mogrifier_rank": 40},
        "search_space": {
            "learning_rate": {"low": 0.001, "high": 0.006, "log": True},
            "input_dropout": {"low": 0.0, "high": 0.5},
            "state_dropout": {"low": 0.0, "high": 0.4},
            "output_dropout": {"low": 0.0, "high": 0.6},
        },
        "tuning": {"sampler": "gp", "trials": trials, "startup_trials": 2, "concurrency": 2, "seed": 0},
        "resources": {"cpus_per_trial": 1, "gpus_per_trial": 0},
    }


def tuner(*arguments: str, home: Path, timeout: float) -> subprocess.CompletedProcess:
    environment = {**os.environ, "LM_TUNER_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "lm_tuner.tuner", *arguments], env=environment, text=True,
                          capture_output=True, timeout=timeout, check=True)


def family_results(trials: list[dict[str, Any]], family: str) -> dict[str, Any]:
    rows = [row for row in trials if row["family"] == family and row["stage"] == "tune"]
    complete = [row for row in rows if row["state"] == "COMPLETE"]
    best = min(complete, key=lambda row: row["value"], default=None)
    return {
        "trials": [{
            "number": row["number"], "state": row["state"], "hidden_size": row["hidden_size"],
            "parameter_count": row["parameter_count"],
            "params": {key.removeprefix("param."): value for key, value in row.items() if key.startswith("param.")},
            "subset_validation_perplexity": None if row["value"] is None else math.exp(row["value"]),
            "full_validation_perplexity": None if row.get("full_value") is None else math.exp(row["full_value"]),
            "train_seconds": row.get("train_seconds"), "eval_seconds": row.get("eval_seconds"),
            "wall_seconds": row["wall_seconds"],
        } for row in rows],
        "best_trial": None if best is None else best["number"],
        "best_subset_validation_perplexity": None if best is None else math.exp(best["value"]),
        "best_full_validation_perplexity": None if best is None or best.get("full_value") is None
        else math.exp(best["full_value"]),
    }


def write_result(output: Path, result: dict[str, Any]) -> None:
    """The result as JSON, and each family's best perplexities printed."""
    output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    for family, found in result["families"].items():
        print(f"{family}: best subset {found['best_subset_validation_perplexity']}, "
              f"full {found['best_full_validation_perplexity']}, trials {len(found['trials'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="a folder with the PTB word-level files")
    parser.add_argument("--trial-seconds", type=float, default=420.0, help="each trial's wall-clock budget")
    parser.add_argument("--trials", type=int, default=3, help="trials per family")
    parser.add_argument("--output", type=Path, required=True)
    arguments = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="real-corpus-") as folder:
        home = Path(folder)
        space = home / "study.yaml"
        space.write_text(yaml.safe_dump(study_spec(arguments.data.resolve(), arguments.trial_seconds,
                                                   arguments.trials), sort_keys=False))
        checked = json.loads(tuner("data", "check", str(arguments.data), "--format", "ptb", "--json", home=home,
                                   timeout=600).stdout)
        plan = json.loads(tuner("plan", "--space", str(space), "--json", home=home, timeout=600).stdout)
        started = time.monotonic()
        launch = tuner("launch", "--space", str(space), home=home, timeout=4 * 3600)
        study_seconds = time.monotonic() - started
        trials = json.loads(tuner("export", "real-corpus-ptb", "--format", "json", home=home, timeout=600).stdout)

    families = {family: family_results(trials, family) for family in FAMILIES}
    train = sum(row.get("train_seconds") or 0.0 for row in trials)
    evaluate = sum(row.get("eval_seconds") or 0.0 for row in trials)
    unigram = checked["unigram_perplexity"]
    result = {
        "benchmark": "real_corpus",
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "spec": study_spec(Path("PTB"), arguments.trial_seconds, arguments.trials),
        "unigram_validation_perplexity": unigram,
        "plan": plan,
        "study_wall_seconds": study_seconds,
        "evaluation_share": evaluate / (train + evaluate) if train + evaluate else None,
        "families": families,
        "launch_output_tail": launch.stdout[-3000:],
    }
    write_result(arguments.output, result)
    print(f"unigram {unigram}, evaluation share {result['evaluation_share']}, study {study_seconds:.0f} s")


if __name__ == "__main__":
    main()
