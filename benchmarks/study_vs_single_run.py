"""Is a study worth its compute? One careful run against a compute-budgeted study, on the same machine, in one run.

(a) One run of a sensible hand-set LSTM (benchmarks/ptb_short.py's: 4M parameters, Two-Tailed Averaging, Adam at the
    top of the tuned range) for `--single-minutes` of wall-clock time on every core, scored on the whole validation
    split afterwards.
(b) A study of LSTM against Mogrifier LSTM for `--study-minutes`, written as the README recommends: a compute budget
    for the whole study (`compute_budget.wall_minutes`), successive halving with rungs in training tokens, and the
    published configurations as the first ones (`tuning.priors`), launched by the real CLI (`tuner launch`) on a copy
    of the corpus imported with `tuner data fetch ptb --from`. Its finalists are scored on the whole validation split
    by the study itself.

With `--device gpu` (a GPU machine; ../shared/tools/gpu/ in the project's workspace shows how to run there), both
sides are the paper's size, 24M parameters, two layers, batch 64 x 70, and both run through `tuner launch`:
(a) is a one-trial study of the paper's best LSTM configuration (`tuning.priors`, the LSTM's published settings with
    the regularisation scaled to the run's length) trained for `--single-minutes` of wall-clock time on the whole
    GPU, (b) the study of LSTM against Mogrifier LSTM over the thesis's ranges, its trials one at a time on the
    whole GPU as the single run is (the probe that fixes the study's plan times a family alone on the GPU).

The JSON holds `single_run.full_valid_ppl`, `study.best_full_valid_ppl`, per family the training tokens and the
device-seconds its trials used (`study.family_tokens`, `study.family_compute_seconds`, from the study's compute
account), the study's wall-clock time and plan, and the CPU.

    PYTHONPATH=. python benchmarks/study_vs_single_run.py --data /path/to/ptb \\
        --output benchmarks/results/study_vs_single_run_<cpu>.json
    PYTHONPATH=. python benchmarks/study_vs_single_run.py --device gpu --data /path/to/ptb \\
        --output benchmarks/results/study_vs_single_run_<gpu>.json
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from benchmarks.cell_throughput import describe_cpu, emit_json

STUDY = "study-vs-single-run"
SINGLE_RUN = "single-run"
FAMILIES = ("lstm", "mogrifier")
GPU_TRAINING = {"steps_per_turn": 200, "batch_size": 64, "bptt": 70, "eval_batch_size": 64,
                "validation_tokens": 20_000, "averaging": {"kind": "2ta"}}
GPU_SEARCH_SPACE = {  # thesis Table 2.4, as spaces/ptb_comparison.yaml declares it
    "learning_rate": {"low": 0.001, "high": 0.004, "log": True},
    "l2_penalty": {"low": 5.0e-6, "high": 1.0e-3, "log": True},
    "input_embedding_ratio": {"low": 0.0, "high": 2.0},
    "input_dropout": {"low": 0.0, "high": 0.9},
    "inter_layer_dropout": {"low": 0.0, "high": 0.95},
    "state_dropout": {"low": 0.0, "high": 0.8},
    "output_dropout": {"low": 0.0, "high": 0.95},
    "mogrifier_rounds": {"low": 0, "high": 6},
    "mogrifier_rank": {"low": -20, "high": 100},
}


def study_spec(minutes: float) -> dict[str, Any]:
    """The README's own-corpus study on PTB: the single run's kind of model (4M parameters, one layer, tied
    embeddings, 2TA, batch 32 x 35) with its learning rate, dropout and embedding size searched, a compute budget for
    the whole study, successive halving (2 rungs: 3 configurations per family, the best trained 3x as far) and the
    published configurations first."""
    return {
        "name": STUDY,
        "description": "LSTM vs Mogrifier LSTM on PTB at 4M parameters with a compute budget "
                       "(benchmarks/study_vs_single_run.py)",
        "dataset": {"name": "ptb"},
        "families": list(FAMILIES),
        "parameter_budget": 4_000_000,
        "compute_budget": {"wall_minutes": minutes, "rungs": 2},
        "training": {"steps_per_turn": 100, "batch_size": 32, "bptt": 35, "eval_batch_size": 32,
                     "validation_tokens": 10_000, "averaging": {"kind": "2ta"}},
        "fixed": {"num_layers": 1, "mogrifier_rounds": 3, "mogrifier_rank": 0},
        "search_space": {
            "learning_rate": {"low": 0.002, "high": 0.008, "log": True},
            "input_dropout": {"low": 0.0, "high": 0.3},
            "output_dropout": {"low": 0.0, "high": 0.3},
            "input_embedding_ratio": {"low": 0.3, "high": 1.0},
        },
        "tuning": {"sampler": "gp", "concurrency": 2, "priors": True},
        "resources": {"cpus_per_trial": 1},
    }


def gpu_study_spec(minutes: float) -> dict[str, Any]:
    """The same study at the paper's size on one GPU, a trial at a time: the thesis's ranges, priors first."""
    return {
        **study_spec(minutes),
        "description": "LSTM vs Mogrifier LSTM on PTB at 24M parameters with a compute budget "
                       "(benchmarks/study_vs_single_run.py --device gpu)",
        "parameter_budget": 24_000_000,
        "training": GPU_TRAINING,
        "fixed": {"num_layers": 2},
        "search_space": GPU_SEARCH_SPACE,
        "tuning": {"sampler": "gp", "concurrency": 1, "priors": True},
        "resources": {"cpus_per_trial": 4, "gpus_per_trial": 1},
    }


def gpu_single_run_spec(minutes: float) -> dict[str, Any]:
    """One run of the paper's best 24M LSTM (its published settings, regularisation scaled to the run's length, as
    the study's first LSTM configuration is) for `minutes` of wall-clock time on the whole GPU."""
    return {
        "name": SINGLE_RUN,
        "description": "the paper's best 24M LSTM, one run (benchmarks/study_vs_single_run.py --device gpu)",
        "dataset": {"name": "ptb"},
        "families": ["lstm"],
        "parameter_budget": 24_000_000,
        "training": {**GPU_TRAINING, "budget_seconds": minutes * 60},
        "fixed": {"num_layers": 2},
        "search_space": {name: bounds for name, bounds in GPU_SEARCH_SPACE.items()
                         if not name.startswith("mogrifier_")},
        "tuning": {"trials": 1, "concurrency": 1, "priors": True},
        "resources": {"cpus_per_trial": 4, "gpus_per_trial": 1},
    }


def single_run(data: Path, minutes: float, threads: int) -> dict[str, Any]:
    from benchmarks.ptb_short import run_model

    started = time.monotonic()
    record = run_model("lstm", str(data), minutes, threads, None, eval_every=25.0, eval_tokens=10_000,
                       parameter_budget=4_000_000, reference_parameters_target=0, overrides={})
    return {"full_valid_ppl": record["full_valid_ppl"]["end"], "minutes": minutes, "threads": threads,
            "wall_seconds": time.monotonic() - started, "steps": record["curve"][-1]["step"],
            "cpu_seconds": record["curve"][-1]["cpu_seconds"], "configuration": record["configuration"],
            "curve": record["curve"]}


def tuner(*arguments: str, environment: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "lm_tuner.tuner", *arguments], env=environment, text=True,
                          capture_output=True, timeout=timeout)
    if done.returncode != 0:
        sys.exit(f"`tuner {' '.join(arguments)}` exited with {done.returncode}:\n{done.stdout[-3000:]}"
                 f"{done.stderr[-3000:]}")
    return done


def run_study(data: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Launch `spec` with the real CLI in a home of its own, on a copy of the corpus imported from `data`."""
    with tempfile.TemporaryDirectory(prefix="study-vs-single-run-") as folder:
        home = Path(folder)
        environment = {**os.environ, "LM_TUNER_HOME": str(home), "LM_TUNER_DATA": str(home / "datasets"),
                       "COLUMNS": "200"}
        tuner("data", "fetch", "ptb", "--from", str(data), environment=environment, timeout=600)
        space = home / "study.yaml"
        space.write_text(yaml.safe_dump(spec, sort_keys=False))
        started = time.monotonic()
        launch = tuner("launch", "--space", str(space), environment=environment, timeout=6 * 3600)
        wall = time.monotonic() - started
        return {**study_record(f"sqlite:///{home / 'tuner.db'}", spec["name"], spec["families"]),
                "wall_seconds": wall, "launch_output_tail": launch.stdout[-4000:]}


def study_record(url: str, name: str, family_names: list[str]) -> dict[str, Any]:
    """The study's best full-validation perplexity (its finalists, rescored on the whole split), and per family the
    tokens and device-seconds of its trials, from the database the study wrote."""
    from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord

    with Session(create_engine(url)) as session:
        study = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
        trials = session.scalars(select(TrialRecord).where(TrialRecord.study_name == name)).all()
    families: dict[str, Any] = {}
    for family in family_names:
        rows = [t for t in trials if t.family == family and t.stage == "tune"]
        finalists = [t for t in rows if t.state == "COMPLETE" and t.full_value is not None]
        best = min(finalists, key=lambda t: t.full_value, default=None)
        families[family] = {
            "best_full_valid_ppl": None if best is None else math.exp(best.full_value),
            "trials": [{"number": t.number, "state": t.state, "tokens": t.tokens,
                        "compute_seconds": t.compute_seconds, "subset_valid_ppl": None if t.value is None
                        else math.exp(t.value)} for t in sorted(rows, key=lambda t: t.number)],
        }
    best = min((f["best_full_valid_ppl"], name) for name, f in families.items() if f["best_full_valid_ppl"])
    return {
        "status": study.status, "error": study.error, "plan": study.plan,
        "best_full_valid_ppl": best[0], "best_family": best[1],
        "family_tokens": {name: sum(t["tokens"] or 0 for t in f["trials"]) for name, f in families.items()},
        "family_compute_seconds": {name: sum(t["compute_seconds"] or 0.0 for t in f["trials"])
                                   for name, f in families.items()},
        "families": families,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="folder with ptb.train.txt, ptb.valid.txt, "
                                                                   "ptb.test.txt")
    parser.add_argument("--single-minutes", type=float, default=10.0, help="the single run's wall-clock minutes")
    parser.add_argument("--study-minutes", type=float, default=30.0, help="the study's compute_budget.wall_minutes")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the single run's threads (CPU)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="cpu: 4M parameters on every core; gpu: 24M parameters on the machine's GPU, the single "
                             "run as a one-trial study of the paper's best LSTM")
    parser.add_argument("--single-run-from", type=Path,
                        help="a result file of this benchmark whose single run to keep (measured earlier on a "
                             "machine of the same kind), instead of running it again")
    parser.add_argument("--output", type=Path, help="write the JSON here (it is always printed; after the single run "
                                                    "too, so that a study cut short keeps the first half)")
    arguments = parser.parse_args(argv)
    data = arguments.data.resolve()
    gpu = arguments.device == "gpu"
    spec = gpu_study_spec(arguments.study_minutes) if gpu else study_spec(arguments.study_minutes)
    result: dict[str, Any] = {
        "benchmark": "study_vs_single_run",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": arguments.device,
        "cpu": describe_cpu(),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "load_average_before": os.getloadavg()},
        "spec": spec,
    }
    if gpu:
        import torch

        result["machine"]["gpu"] = torch.cuda.get_device_name()
    if arguments.single_run_from is not None:
        earlier = json.loads(arguments.single_run_from.read_text())
        result["single_run"] = {**earlier["single_run"], "measured_earlier": {
            "date": earlier["date"], "machine": earlier["machine"], "spec": earlier.get("single_run_spec")}}
    elif gpu:
        single_spec = gpu_single_run_spec(arguments.single_minutes)
        result["single_run_spec"] = single_spec
        started = time.monotonic()
        record = run_study(data, single_spec)
        result["single_run"] = {**record, "full_valid_ppl": record["best_full_valid_ppl"],
                                "minutes": arguments.single_minutes, "wall_seconds": time.monotonic() - started}
    else:
        result["single_run"] = single_run(data, arguments.single_minutes, arguments.threads)
    emit_json(result, arguments.output)
    study = result["study"] = run_study(data, spec)
    tokens = list(study["family_tokens"].values())
    result["machine"]["load_average_after"] = os.getloadavg()
    result["study_over_single_run"] = study["best_full_valid_ppl"] / result["single_run"]["full_valid_ppl"]
    result["family_tokens_spread"] = (max(tokens) - min(tokens)) / max(tokens) if max(tokens) else None
    emit_json(result, arguments.output)
    return result


if __name__ == "__main__":
    main()
