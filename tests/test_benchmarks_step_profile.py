"""benchmarks/step_profile.py on a CPU: a profile per model, entries ranked by self time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_step_profile_ranks_each_models_operators(tmp_path: Path) -> None:
    output = tmp_path / "profile.json"
    command = [sys.executable, "benchmarks/step_profile.py", "--device", "cpu", "--threads", "1", "--families", "lstm",
               "--steps", "1", "--top", "4", "--output", str(output)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=300,
                   env=os.environ | {"PYTHONPATH": str(ROOT)})
    profiles = json.loads(output.read_text())["profiles"]
    assert set(profiles) == {"torch.nn.LSTM", "lstm"}
    for profile in profiles.values():
        times = [entry["microseconds_per_step"] for entry in profile["top"]]
        assert len(times) == 4 and times == sorted(times, reverse=True) and times[-1] > 0
        assert 0 < sum(entry["share"] for entry in profile["top"]) <= 1 + 1e-9
        assert profile["time"] == "cpu" and profile["wall_seconds_per_step"] > 0
    assert profiles["torch.nn.LSTM"]["wall_vs_reference"] == 1.0
