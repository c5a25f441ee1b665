"""The clocks of a training run: wall-clock and process CPU seconds, which budgets and reports
count and which carry on across a resumption.
"""

from __future__ import annotations

import time


class Stopwatch:
    """Wall-clock and process CPU seconds of a run, counted on across resumptions."""

    def __init__(self) -> None:
        self.wall_before = self.process_before = 0.0
        self.restart()

    def restart(self) -> None:
        self.wall_started, self.process_started = time.perf_counter(), time.process_time()

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.wall_started

    def process(self) -> float:
        return self.process_before + time.process_time() - self.process_started

    def state_dict(self) -> dict[str, float]:
        return {"wall": self.wall(), "process": self.process()}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.wall_before, self.process_before = state["wall"], state["process"]
        self.restart()
