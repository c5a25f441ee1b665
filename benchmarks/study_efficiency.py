"""Where a study's time goes: training, evaluating, checkpointing, set-up, and waiting.

    PYTHONPATH=. python benchmarks/study_efficiency.py --output benchmarks/results/study_efficiency_cpu_zen4.json

Runs a study through `tuner launch` (by default the embedded demo, spaces/quickstart.yaml, exactly what `make demo`
runs) in a fresh home folder and reads the database it wrote. Per tuning trial, from its turns (trainers/training.py
measures each part): seconds of optimisation steps, of validation evaluation (the softmax temperature search
included), of checkpoint writes, of set-up (model, resumed state, compiled kernels), and the rest of the trial's
life as the controller saw it (Ray starting its worker, loading the data, reporting). For the study: its wall-clock
time, the core-seconds it had (wall time x the cores its trials use at once) and the share of them spent training
(`training_share`), and the wall time over the trials' summed training time (`wall_over_training`).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import yaml
from sqlalchemy import create_engine, text

from benchmarks.cell_throughput import describe_cpu, emit_json

TRIALS = text("""
    SELECT t.trial_id, t.number, s.study_name, t.datetime_start, t.datetime_complete, t.state
    FROM trials t JOIN studies s ON s.study_id = t.study_id
    WHERE s.study_name LIKE :prefix AND t.datetime_complete IS NOT NULL
""")
TURN_SECONDS = text("""
    SELECT trial_id, sum(train_seconds), sum(eval_seconds), sum(checkpoint_seconds), sum(setup_seconds)
    FROM lmt_turns GROUP BY trial_id
""")
STAGES = ("training", "evaluating", "checkpointing", "set_up")


def run_study(space: Path, home: Path) -> tuple[datetime, datetime]:
    """Launch the study in `home`; returns when the command started and ended (local time, as Optuna records)."""
    environment = {**os.environ, "LM_TUNER_HOME": str(home), "COLUMNS": "160"}
    started = datetime.now()
    launch = subprocess.run([sys.executable, "-m", "lm_tuner.tuner", "launch", "--space", str(space)],
                            env=environment, capture_output=True, text=True)
    ended = datetime.now()
    if launch.returncode != 0:
        raise RuntimeError(f"tuner launch failed ({launch.returncode}):\n{launch.stderr[-3000:]}")
    return started, ended


def trial_accounts(database: Path, study: str) -> list[dict]:
    """Per finished trial of the study's tuning stage: its seconds per part, and its life as the controller saw it."""
    engine = create_engine(f"sqlite:///{database}")
    with engine.connect() as connection:
        parts = {row[0]: row[1:] for row in connection.execute(TURN_SECONDS)}
        rows = connection.execute(TRIALS, {"prefix": f"{study}/%"}).all()
    accounts = []
    for trial_id, number, optuna_study, begun, ended, state in rows:
        life = (_moment(ended) - _moment(begun)).total_seconds()
        seconds = dict(zip(STAGES, (value or 0.0 for value in parts.get(trial_id, (0.0,) * 4)), strict=True))
        accounts.append({"study": optuna_study, "number": number, "state": state, "life_seconds": life, **seconds,
                         "other_in_trial": life - sum(seconds.values()), "began": _moment(begun),
                         "ended": _moment(ended)})
    return accounts


def _moment(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def study_account(accounts: list[dict], started: datetime, ended: datetime, cores: int) -> dict:
    """The study's core-seconds by part. Outside its trials: before the first began (the command starting, Ray,
    the corpus), after the last ended (the stages after tuning, the summary), and between (cores left idle while
    the sampler proposed, Ray started a trial, or no trial was left to run beside the last ones)."""
    wall_seconds = (ended - started).total_seconds()
    core_seconds = wall_seconds * cores
    before = (min(account["began"] for account in accounts) - started).total_seconds()
    after = (ended - max(account["ended"] for account in accounts)).total_seconds()
    totals = {part: sum(account[part] for account in accounts) for part in (*STAGES, "other_in_trial")}
    lives = sum(account["life_seconds"] for account in accounts)
    return {
        "wall_seconds": wall_seconds,
        "cores": cores,
        "core_seconds": core_seconds,
        "trials": len(accounts),
        **{f"{part}_seconds": value for part, value in totals.items()},
        "outside_trials_core_seconds": core_seconds - lives,
        "before_first_trial_seconds": before,
        "after_last_trial_seconds": after,
        "idle_between_trials_core_seconds": core_seconds - lives - (before + after) * cores,
        "shares_of_core_seconds": {part: value / core_seconds for part, value in totals.items()}
        | {"outside_trials": (core_seconds - lives) / core_seconds},
        "training_share": totals["training"] / core_seconds,
        "wall_over_training": wall_seconds / totals["training"],
    }


def cores_used(space: dict) -> int:
    tuning, resources = space.get("tuning", {}), space.get("resources", {})
    wanted = tuning.get("concurrency", 1) * resources.get("cpus_per_trial", 1)
    return min(wanted, os.cpu_count() or 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", type=Path, default=Path("spaces/quickstart.yaml"))
    parser.add_argument("--output", type=Path, help="write the result here as JSON")
    args = parser.parse_args()
    space = yaml.safe_load(args.space.read_text())
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="study-efficiency-") as folder:
        home = Path(folder) / "home"
        started, ended = run_study(args.space, home)
        accounts = trial_accounts(home / "tuner.db", space["name"])
    result = {
        "benchmark": "study_efficiency",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**describe_cpu(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "space": str(args.space),
        "study": study_account(accounts, started, ended, cores_used(space)),
        "trials": [{**account, "began": str(account["began"]), "ended": str(account["ended"])} for account in accounts],
    }
    emit_json(result, args.output)


if __name__ == "__main__":
    main()
