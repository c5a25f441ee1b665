"""Live progress of a running study on the terminal: a line per trial start and end, and (inside
`live_progress`) a live board of every family's running and finished trials, never silent for long.

After each end: what this run has done of what it will do (a resumed study counts only what is left),
the study's trials per stage, the best tuning trial so far and the time left in the current stage, all
read from the database through tuner.store, as the API and the dashboard read them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ray.tune import Callback
from rich.console import Console
from rich.markup import escape

from lm_tuner.tuner.analysis.family_tallies import family_tallies
from lm_tuner.tuner.cli.common import duration_text, score_name
from lm_tuner.tuner.cli.live_board import Board
from lm_tuner.tuner.cli.live_display import ProgressDisplay
from lm_tuner.tuner.run.recorder import SHOWN_BY_PROGRESS
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.spec.units import Unit, unit_of
from lm_tuner.tuner.store import Storage, StudyProgress, TrialRecord

OUTCOMES = {"COMPLETE": "[green]complete[/green]", "PRUNED": "[yellow]pruned[/yellow]", "FAIL": "[red]failed[/red]"}
INTERRUPTED = "[yellow]interrupted[/yellow]"  # failed because the run stopped; a resume runs it again


@contextmanager
def live_progress(storage_url: str, spec: StudySpec, console: Console | None = None,
                  clock: Callable[[], float] = time.monotonic) -> Iterator[ProgressPrinter]:
    """The callback to give the study's run, with the live board shown until the block ends."""
    spec_data = spec.model_dump(mode="json")
    display = ProgressDisplay(Board(spec_data, clock), console or Console(highlight=False), clock)
    shown = logging.getLogger("lm_tuner")
    shown.addFilter(_shown_by_progress)  # the printer prints the study's warnings as they are stored
    try:
        with display:
            yield ProgressPrinter(storage_url, spec.name, display)
    finally:
        shown.removeFilter(_shown_by_progress)


def _shown_by_progress(record: logging.LogRecord) -> bool:
    return not getattr(record, SHOWN_BY_PROGRESS, False)


class ProgressPrinter(Callback):
    """Prints trial starts and ends with this run's and the study's progress, the best so far and an ETA; feeds
    a live board, if given one, with the trials' starts, turns and ends."""
    def __init__(self, storage_url: str, study: str, display: ProgressDisplay | None = None) -> None:
        self._url = storage_url
        self._study = study
        self._display = display
        self._unit: Unit | None = None
        self._settled_before: dict[str, int] | None = None  # per stage, when this run's first trial started
        self._outcomes = {"complete": 0, "pruned": 0, "failed": 0, "interrupted": 0}
        self._best: tuple[float, str] | None = None
        self._warnings_shown: int | None = None  # of the study's stored warnings; earlier runs' are not repeated
        self._pruned_before: int | None = None  # configurations pruned before this run (successive halving)
        self._live: int | None = None  # trials Ray runs now, as of the last end (the study's count adds those waiting)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_display": None}  # Ray pickles callbacks; the display lives in this process only

    @property
    def display(self) -> ProgressDisplay | None:
        return self._display

    @property
    def _console(self) -> Console:
        return Console(highlight=False)  # not kept as state: Ray pickles callbacks

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._begin()
        record = self._record(trial)
        params = ", ".join(f"{k}={_short(v)}" for k, v in trial.config["params"].items())
        if self._display is not None:
            stage = "" if record.stage == "tune" else record.stage
            self._display.board.trial_started(record.trial_id, record.family, f"{stage}#{record.number}")
            self._read_study(self._progress())
        rung = trial.config.get("rung")
        promoted = f"  [cyan]promoted to rung {rung}[/cyan]" if rung else ""
        self._print(f"[dim]start[/dim]  {self._label(trial, record)}  {params}{promoted}")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if self._display is not None:
            self._display.board.trial_reported(trial.config["optuna_trial_id"], result)
        self._begin()
        warnings = Storage(self._url).warnings(self._study)  # the recorder, called first, stores them
        for warning in warnings[self._warnings_shown:]:
            self._print(f"[yellow]warning:[/yellow] {escape(warning)}")
        self._warnings_shown = len(warnings)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._live = sum(1 for other in trials if other is not trial and other.status == "RUNNING")
        self._finished(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._live = sum(1 for other in trials if other is not trial and other.status == "RUNNING")
        self._finished(trial)

    def _begin(self) -> None:
        """Notes what the study had settled before this run (interrupted trials were failed by then)."""
        if self._settled_before is not None:
            return
        study = Storage(self._url).study(self._study)
        self._unit = unit_of(study.spec)
        self._warnings_shown = len(study.warnings)
        progress = study.progress
        self._settled_before = {stage.stage: stage.settled for stage in progress.stages}
        self._pruned_before = sum(tally.pruned for tally in family_tallies(self._url, self._study).values())
        if progress.settled:
            self._print(f"resumed: {progress.settled} of {progress.planned} trials already done "
                        f"({_stages(progress)}); this run: {progress.planned - progress.settled}")

    def _finished(self, trial: Any) -> None:
        self._begin()
        record = self._record(trial)  # the searcher has recorded the trial's end by now
        label = self._label(trial, record)
        if "rung" in trial.config and record.state == "RUNNING":
            self._rung_ended(trial, record, label)
            return
        outcome = "interrupted" if record.interrupted else {"COMPLETE": "complete", "PRUNED": "pruned"}.get(
            record.state, "failed")
        self._outcomes[outcome] += 1
        if "rung" in trial.config:
            self._outcomes["pruned"] = self._pruned_in_this_run()
        detail = ""
        if record.value is not None:
            detail = f"{score_name(self._unit)} {self._unit.of(record.value):.3f}"
            if record.stage == "tune" and (self._best is None or record.value < self._best[0]):
                self._best = (record.value, label)
        shown = INTERRUPTED if record.interrupted else OUTCOMES.get(record.state, record.state)
        progress = self._progress()
        if self._display is not None:
            self._display.board.trial_ended(record.trial_id)
            self._read_study(progress)
        self._print(f"{shown}  {label}  {detail}  |  {self._summary(progress)}")

    def _rung_ended(self, trial: Any, record: TrialRecord, label: str) -> None:
        """A segment of successive halving ended at its rung: the configuration waits for the rung's other results,
        and those decided by this one (pruned, or promoted) are counted from the study's record."""
        result = trial.last_result or {}
        score = result.get("best_val_loss")
        detail = "" if score is None else f"{score_name(self._unit)} {self._unit.of(score):.3f} "
        tokens = result.get("tokens")
        at = "" if tokens is None else f"at {tokens:,} tokens"
        self._outcomes["pruned"] = self._pruned_in_this_run()
        progress = self._progress()
        if self._display is not None:
            self._display.board.trial_ended(record.trial_id)
            self._read_study(progress)
        self._print(f"[cyan]rung {trial.config['rung']}[/cyan]  {label}  {detail}{at}  |  {self._summary(progress)}")

    def _pruned_in_this_run(self) -> int:
        """Configurations pruned since this run began (successive halving prunes them as a rung closes, no trial of
        theirs ending)."""
        pruned = sum(tally.pruned for tally in family_tallies(self._url, self._study).values())
        return pruned - (self._pruned_before or 0)

    def _summary(self, progress: StudyProgress) -> str:
        before = self._settled_before or {}
        # Planned counts of later stages can shrink as earlier ones finish; never below what is settled.
        left = sum(max(stage.planned - before.get(stage.stage, 0), 0) for stage in progress.stages)
        done = sum(max(stage.settled - before.get(stage.stage, 0), 0) for stage in progress.stages)
        outcomes = ", ".join(f"{count} {name}" for name, count in self._outcomes.items()
                             if count or name != "interrupted")
        best = f"best {self._unit.of(self._best[0]):.3f} ({self._best[1]})" if self._best else "best -"
        current = progress.current
        eta = "-" if current is None or current.eta_seconds is None else \
            f"{current.label} {duration_text(current.eta_seconds)}"
        running = f"{progress.running} running"
        if self._live is not None and progress.running > self._live:  # successive halving: configurations at a rung
            running = f"{self._live} running, {progress.running - self._live} waiting at a rung"
        return f"this run {done}/{left} done ({outcomes}), {running}  |  {_stages(progress)}  |  {best}  |  ETA {eta}"

    def _read_study(self, progress: StudyProgress) -> None:
        self._display.board.study_read(family_tallies(self._url, self._study), progress)

    def _progress(self) -> StudyProgress:
        return Storage(self._url).study(self._study).progress

    def _record(self, trial: Any) -> TrialRecord:
        return Storage(self._url).trial_record(trial.config["optuna_trial_id"])

    def _label(self, trial: Any, record: TrialRecord) -> str:
        stage = "" if record.stage == "tune" else f"/{record.stage}"
        return f"{self._study}/{trial.config['family']}{stage}#{trial.config['number']}"

    def _print(self, line: str) -> None:
        if self._display is not None:
            self._display.print(line)
        else:
            self._console.print(line, soft_wrap=True)  # one line per event, also in a log file


def _stages(progress: StudyProgress) -> str:
    return ", ".join(f"{stage.label} {stage.settled}/{stage.planned}" for stage in progress.stages)


def _short(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
