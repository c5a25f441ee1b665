"""benchmarks/command_latency.py: every reading command timed as a user runs it, beside another revision's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.command_latency import COMMANDS

ROOT = Path(__file__).resolve().parent.parent


def test_each_command_is_timed_against_the_interpreter_and_a_baseline_revision(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline" / "lm_tuner"  # this checkout again, laid out as another revision would be
    baseline.mkdir(parents=True)
    for folder in ("tuner", "models", "trainers", "api", "dashboards"):
        (baseline / folder).symlink_to(ROOT / folder)
    output = tmp_path / "latency.json"
    subprocess.run([sys.executable, "benchmarks/command_latency.py", "--rounds", "1", "--baseline",
                    str(baseline.parent), "--output", str(output)], cwd=ROOT, check=True, capture_output=True,
                   timeout=300, env=os.environ | {"PYTHONPATH": str(ROOT)})
    result = json.loads(output.read_text())
    assert set(result["commands"]) == set(COMMANDS) and result["interpreter_start"]["seconds_median"] > 0
    for timed in result["commands"].values():  # a command that failed would have stopped the benchmark
        assert timed["seconds_median"] > result["interpreter_start"]["seconds_median"]
        assert timed["over_baseline"] == timed["seconds_median"] / timed["baseline_seconds_median"]
