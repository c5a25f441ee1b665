"""Live progress of a running study on the terminal: a line per finished trial with the totals."""

from __future__ import annotations

import math
import time
from typing import Any

from ray.tune import Callback
from rich.console import Console

from tuner.db import optuna_storage


class ProgressPrinter(Callback):
    """Prints trial starts and ends with done/running/pruned/failed counts, best so far and an ETA."""

    def __init__(self, storage_url: str, study: str, total_trials: int) -> None:
        self._url = storage_url
        self._study = study
        self._total = total_trials
        self._counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
        self._running: set[str] = set()
        self._best: tuple[float, str] | None = None
        self._started = time.monotonic()

    @property
    def _console(self) -> Console:
        return Console(highlight=False)  # not kept as state: Ray pickles callbacks

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._running.add(trial.trial_id)
        params = ", ".join(f"{k}={_short(v)}" for k, v in trial.config["params"].items())
        self._console.print(f"[dim]start[/dim]  {self._label(trial)}  {params}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finished(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._finished(trial)

    def _finished(self, trial: Any) -> None:
        self._running.discard(trial.trial_id)
        frozen = optuna_storage(self._url).get_trial(trial.config["optuna_trial_id"])
        state = frozen.state.name
        self._counts[state] = self._counts.get(state, 0) + 1
        outcome = {"COMPLETE": "[green]complete[/green]", "PRUNED": "[yellow]pruned[/yellow]",
                   "FAIL": "[red]failed[/red]"}.get(state, state)
        detail = ""
        if frozen.value is not None:
            detail = f"val ppl {math.exp(frozen.value):.3f}"
            if self._best is None or frozen.value < self._best[0]:
                self._best = (frozen.value, self._label(trial))
        self._console.print(f"{outcome}  {self._label(trial)}  {detail}  |  {self._summary()}")

    def _summary(self) -> str:
        done = sum(self._counts.values())
        best = f"best {math.exp(self._best[0]):.3f} ({self._best[1]})" if self._best else "best -"
        elapsed = time.monotonic() - self._started
        remaining = self._total - done
        eta = _duration(elapsed / done * remaining) if done and remaining > 0 else "-"
        return (f"{done}/{self._total} done ({self._counts['COMPLETE']} complete, {self._counts['PRUNED']} pruned, "
                f"{self._counts['FAIL']} failed), {len(self._running)} running, {best}, ETA {eta}")

    def _label(self, trial: Any) -> str:
        return f"{self._study}/{trial.config['family']}#{trial.config['number']}"


def _short(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
