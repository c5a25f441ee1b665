"""Is a study worth its compute? One careful run against a compute-budgeted study, on the same machine, in one run.

(a) One run of a sensible hand-set LSTM (benchmarks/ptb_short.py's: 4M parameters, Two-Tailed Averaging, Adam at the
    top of the tuned range) for `--single-minutes` of wall-clock time on every core, scored on the whole validation
    split afterwards.
(b) A study of LSTM against Mogrifier LSTM for `--study-minutes`, written as the README recommends: a compute budget
    for the whole study (`compute_budget.wall_minutes`), successive halving with rungs in training tokens, and the
    published configurations as the first ones (`tuning.priors`), launched by the real CLI (`tuner launch`) on a copy
    of the corpus imported with `tuner data fetch ptb --from`. Its finalists are scored on the whole validation split
    by the study itself.

The JSON holds `single_run.full_valid_ppl`, `study.best_full_valid_ppl`, per family the training tokens and the
device-seconds its trials used (`study.family_tokens`, `study.family_compute_seconds`, from the study's compute
account), the study's wall-clock time and plan, and the CPU.

    PYTHONPATH=. python benchmarks/study_vs_single_run.py --data /path/to/ptb \\
        --output benchmarks/results/study_vs_single_run_<cpu>.json
"""

from __future__ import annotations

import argparse
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
FAMILIES = ("lstm", "mogrifier")


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
    return subprocess.run([sys.executable, "-m", "lm_tuner.tuner", *arguments], env=environment, text=True,
                          capture_output=True, timeout=timeout, check=True)


def run_study(data: Path, minutes: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="study-vs-single-run-") as folder:
        home = Path(folder)
        environment = {**os.environ, "LM_TUNER_HOME": str(home), "LM_TUNER_DATA": str(home / "datasets"),
                       "COLUMNS": "200"}
        tuner("data", "fetch", "ptb", "--from", str(data), environment=environment, timeout=600)
        space = home / "study.yaml"
        space.write_text(yaml.safe_dump(study_spec(minutes), sort_keys=False))
        started = time.monotonic()
        launch = tuner("launch", "--space", str(space), environment=environment, timeout=6 * 3600)
        wall = time.monotonic() - started
        return {**study_record(f"sqlite:///{home / 'tuner.db'}"), "wall_seconds": wall,
                "launch_output_tail": launch.stdout[-4000:]}


def study_record(url: str) -> dict[str, Any]:
    """The study's best full-validation perplexity (its finalists, rescored on the whole split), and per family the
    tokens and device-seconds of its trials, from the database the study wrote."""
    from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord

    with Session(create_engine(url)) as session:
        study = session.scalar(select(StudyRecord).where(StudyRecord.name == STUDY))
        trials = session.scalars(select(TrialRecord).where(TrialRecord.study_name == STUDY)).all()
    families: dict[str, Any] = {}
    for family in FAMILIES:
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
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the single run's threads")
    parser.add_argument("--output", type=Path, help="write the JSON here (it is always printed)")
    arguments = parser.parse_args(argv)
    data = arguments.data.resolve()
    load_before = os.getloadavg()
    single = single_run(data, arguments.single_minutes, arguments.threads)
    study = run_study(data, arguments.study_minutes)
    tokens = list(study["family_tokens"].values())
    result = {
        "benchmark": "study_vs_single_run",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": describe_cpu(),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "load_average_before": load_before,
                    "load_average_after": os.getloadavg()},
        "spec": study_spec(arguments.study_minutes),
        "single_run": single,
        "study": study,
        "study_over_single_run": study["best_full_valid_ppl"] / single["full_valid_ppl"],
        "family_tokens_spread": (max(tokens) - min(tokens)) / max(tokens) if max(tokens) else None,
    }
    emit_json(result, arguments.output)
    return result


if __name__ == "__main__":
    main()
