"""What the live progress of `tuner launch` shows: per family the trials running (with their current turn and
loss) and finished, the best so far, the study's stages and the time elapsed. Fed by the progress callback's
events and the database as it reads it; rendered as a rich table (a terminal) or one line (a log's heartbeat).
The callback's thread writes and a display's thread renders, so every read and write takes the lock."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lm_tuner.tuner.analysis.family_tallies import Tallies, rerun_counts, tally
from lm_tuner.tuner.cli.common import PlainTable, duration_text, score_name
from lm_tuner.tuner.spec.units import unit_of
from lm_tuner.tuner.store import StudyProgress


@dataclass(frozen=True)
class RunningTrial:
    family: str
    name: str  # within its family: #3, or rerun#0 for a later stage's trial
    started: float  # on the board's clock
    turn: int | None = None
    train_loss: float | None = None
    val_loss: float | None = None


class Board:
    """The state of a study's run as the terminal shows it."""

    def __init__(self, spec: dict[str, Any], clock: Callable[[], float]) -> None:
        self._spec = spec
        self._unit = unit_of(spec)
        self._clock = clock
        self._lock = threading.Lock()
        self._began = clock()
        self._running: dict[int, RunningTrial] = {}
        self._tallies: Tallies = {}
        self._progress: tuple[StudyProgress, float] | None = None  # and when it was read

    def trial_started(self, key: int, family: str, name: str) -> None:
        with self._lock:
            self._running[key] = RunningTrial(family, name, self._clock())

    def trial_reported(self, key: int, result: dict[str, Any]) -> None:
        """A turn's report: its number, training loss and validation loss (stage 2 reports validation only)."""
        with self._lock:
            trial = self._running.get(key)
            if trial is not None:
                self._running[key] = replace(trial, turn=result.get("turn", trial.turn),
                                             train_loss=result.get("train_loss"),
                                             val_loss=result.get("val_loss", result.get("best_val_loss")))

    def trial_ended(self, key: int) -> None:
        with self._lock:
            self._running.pop(key, None)

    def study_read(self, tallies: Tallies, progress: StudyProgress) -> None:
        """What the database says of the study's trials, read after each trial's start and end."""
        with self._lock:
            self._tallies, self._progress = tallies, (progress, self._clock())

    def render(self) -> PlainTable:
        with self._lock:
            now, running, tallies = self._clock(), list(self._running.values()), self._tallies
            heading = self._heading(now)
        unit_name = score_name(self._unit)
        table = PlainTable("family", "running", "finished", f"best {unit_name}", "running trials: turn, loss",
                           title=heading, title_justify="left")
        for family in self._spec["families"]:
            mine = [trial for trial in running if trial.family == family]
            table.add_row(family, str(len(mine)), self._finished(tallies, family), self._best(tallies, family),
                          "\n".join(self._trial_text(trial, now) for trial in mine) or "-")
        return table

    def line(self) -> str:
        """The board in one line, for a log: a heartbeat when nothing else was printed for a while."""
        with self._lock:
            now, running, tallies = self._clock(), list(self._running.values()), self._tallies
            heading = self._heading(now)
        families = []
        for family in self._spec["families"]:
            mine = [self._trial_text(trial, now) for trial in running if trial.family == family]
            now_running = f"{len(mine)} running ({'; '.join(mine)})" if mine else "0 running"
            families.append(f"{family}: {now_running}, finished {self._finished(tallies, family)}, "
                            f"best {self._best(tallies, family)}")
        return f"{heading}  |  " + "  |  ".join(families)

    def _heading(self, now: float) -> str:
        """The study, the time since the launch and, once known, its stages and the time left in the current one."""
        parts = [f"{self._spec['name']}: {duration_text(now - self._began)} elapsed"]
        if self._progress is None:
            parts.append("starting (the corpus, Ray and the first trials)")
            return ", ".join(parts)
        progress, read_at = self._progress
        parts.append(", ".join(f"{stage.label} {stage.settled}/{stage.planned}" for stage in progress.stages))
        current = progress.current
        if current is not None and current.eta_seconds is not None:
            left = max(current.eta_seconds - (now - read_at), 0.0)
            parts.append(f"about {duration_text(left)} left in {current.label}")
        return ", ".join(parts)

    def _finished(self, tallies: Tallies, family: str) -> str:
        tuning = tally(tallies, family, "tune")
        text = (f"{tuning.settled}/{self._spec['tuning']['trials']} ({tuning.complete} complete, {tuning.pruned} "
                f"pruned, {tuning.failed} failed)")
        reruns = rerun_counts(self._spec, tallies).get(family)
        return text if reruns is None else f"{text}, reruns {reruns.finished}/{reruns.planned}"

    def _best(self, tallies: Tallies, family: str) -> str:
        best = tally(tallies, family, "tune").best_value
        return "-" if best is None else f"{self._unit.of(best):.3f}"

    def _trial_text(self, trial: RunningTrial, now: float) -> str:
        parts = [trial.name]
        if trial.turn is not None:
            parts.append(f"turn {trial.turn}")
        if trial.train_loss is not None and math.isfinite(trial.train_loss):
            parts.append(f"loss {trial.train_loss:.3f}")
        if trial.val_loss is not None and math.isfinite(trial.val_loss):
            parts.append(f"{score_name(self._unit)} {self._unit.of(trial.val_loss):.2f}")
        parts.append(duration_text(now - trial.started))
        return " ".join(parts)
