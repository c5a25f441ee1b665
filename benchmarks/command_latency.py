"""How long the reading commands take, start to exit: against the interpreter's own start and, given another
revision of the project, against that revision's commands in the same run.

    PYTHONPATH=. python benchmarks/command_latency.py --output benchmarks/results/command_latency_cpu.json
    # against another revision: its folders under BASELINE/lm_tuner (tuner, models, trainers, api, dashboards)
    git worktree add /tmp/before REV && mkdir -p /tmp/baseline/lm_tuner && \
        for d in tuner models trainers api dashboards; do ln -s /tmp/before/$d /tmp/baseline/lm_tuner/$d; done
    PYTHONPATH=. python benchmarks/command_latency.py --baseline /tmp/baseline

A fresh SQLite database holds one study, the demo's spec (spaces/quickstart.yaml) as submitted over REST and not
run yet. Each command runs as a user runs it (`python -m lm_tuner.tuner ...`, a process of its own), `--rounds`
times, in turns with `python -c pass` and with the baseline's command (its folders come first on the path, as the
namespace package lm_tuner), so that the machine's speed that hour weighs on every side alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.cell_throughput import describe_cpu, emit_json

STUDY = "quickstart"
COMMANDS = {
    "tuner --version": ["--version"],
    "tuner list --json": ["list", "--json"],
    "tuner status": ["status", STUDY],
    "tuner status --json": ["status", STUDY, "--json"],
    "tuner best --json": ["best", STUDY, "--json"],
    "tuner compare": ["compare", STUDY],
}
REFERENCE = "python -c pass"


def seeded_database(folder: Path) -> str:
    """A database with the demo's study queued, as `POST /studies` leaves it (its unigram baseline stored)."""
    from lm_tuner.tuner.run.queue import submit_study
    from lm_tuner.tuner.spec import parse_spec
    from lm_tuner.tuner.store.storage import Storage

    url = f"sqlite:///{folder / 'tuner.db'}"
    Storage(url).upgrade()
    document = Path("spaces/quickstart.yaml").read_text()
    submit_study(url, parse_spec(document), document, unigram_perplexity=100.0)
    return url


def seconds_to_exit(arguments: list[str], environment: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, *arguments], env=environment, capture_output=True, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="runs of each command, in turns with the references")
    parser.add_argument("--baseline", type=Path, help="a folder holding another revision's lm_tuner package")
    parser.add_argument("--output", type=Path, help="write the result here as JSON")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="command-latency-") as folder:
        environment = {**os.environ, "LM_TUNER_STORAGE": seeded_database(Path(folder)), "COLUMNS": "160"}
        path = os.pathsep.join(filter(None, [str(args.baseline.resolve()) if args.baseline else "",
                                             os.environ.get("PYTHONPATH", "")]))
        before = None if args.baseline is None else environment | {"PYTHONPATH": path}
        times: dict[str, list[float]] = {REFERENCE: []}
        for _ in range(args.rounds):
            for name, arguments in COMMANDS.items():
                times[REFERENCE].append(seconds_to_exit(["-c", "pass"], environment))
                times.setdefault(name, []).append(seconds_to_exit(["-m", "lm_tuner.tuner", *arguments], environment))
                if before is not None:
                    times.setdefault(f"{name} (baseline)", []).append(
                        seconds_to_exit(["-m", "lm_tuner.tuner", *arguments], before))
    reference = statistics.median(times[REFERENCE])

    def measured(name: str) -> dict[str, float]:
        seconds = statistics.median(times[name])
        found = {"seconds_median": seconds, "seconds_min": min(times[name]),
                 "over_interpreter_start": seconds / reference}
        if before is not None:
            baseline = statistics.median(times[f"{name} (baseline)"])
            found |= {"baseline_seconds_median": baseline, "over_baseline": seconds / baseline}
        return found

    result = {
        "benchmark": "command_latency",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {**describe_cpu(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "rounds": args.rounds,
        "baseline": None if args.baseline is None else str(args.baseline),
        "interpreter_start": {"command": REFERENCE, "seconds_median": reference},
        "commands": {name: measured(name) for name in COMMANDS},
    }
    emit_json(result, args.output)


if __name__ == "__main__":
    main()
