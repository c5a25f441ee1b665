"""`tuner launch` is never silent for long: on a terminal a live board (per family the running trials with their
turn and loss, the finished ones, the best so far, the time elapsed); in a log, a heartbeat line whenever nothing
was printed for 30 s. The callback is driven with fake Ray trials and a fake clock; rows are written directly."""

from __future__ import annotations

import io
import time

from rich.console import Console

from lm_tuner.tuner.cli.live_board import Board
from lm_tuner.tuner.cli.live_display import ProgressDisplay
from lm_tuner.tuner.cli.progress import ProgressPrinter, live_progress
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.store.studies import get_study
from tests.test_progress import add_study, add_trial, finish, ray_trial
from tests.test_reports import TWO_FAMILIES


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stored_spec(url: str, name: str) -> StudySpec:
    return StudySpec.model_validate(get_study(url, name).spec)


def test_a_log_gets_the_board_in_one_line_after_30_silent_seconds(storage_url):
    add_study(storage_url, "beating", tuning={"trials": 2, "concurrency": 2})
    clock, output = FakeClock(), io.StringIO()
    display = ProgressDisplay(Board(get_study(storage_url, "beating").spec, clock),
                              Console(file=output, width=400, highlight=False), clock)
    assert not display.live  # not a terminal
    printer = ProgressPrinter(storage_url, "beating", display)
    trial_id = add_trial(storage_url, "beating", "tune", "RUNNING", seconds=0)
    printer.on_trial_start(0, [], ray_trial(trial_id, 0))
    printer.on_trial_result(0, [], ray_trial(trial_id, 0), {"turn": 2, "train_loss": 1.5, "val_loss": 1.6})

    clock.now += 29.9
    assert not display.beat()
    clock.now += 0.1
    assert display.beat() and not display.beat()  # once, then not again for another 30 s
    clock.now += 15
    finish(storage_url, trial_id, "COMPLETE")
    printer.on_trial_complete(0, [], ray_trial(trial_id, 0))
    clock.now += 29
    assert not display.beat()  # the completion line was printed 29 s ago
    clock.now += 1
    assert display.beat()

    lines = output.getvalue().splitlines()
    assert len(lines) == 4 and lines[0].startswith("start  beating/lstm#0") and lines[2].startswith("complete")
    assert lines[1] == ("beating: 30s elapsed, tuning 0/2  |  lstm: 1 running (#0 turn 2 loss 1.500 val ppl 4.95 "
                        "30s), finished 0/2 (0 complete, 0 pruned, 0 failed), best -")
    assert lines[3].startswith("beating: 1m15s elapsed, tuning 1/2")
    assert lines[3].endswith("lstm: 0 running, finished 1/2 (1 complete, 0 pruned, 0 failed), best 2.718")


def test_the_heartbeat_runs_on_its_own_and_an_event_line_postpones_it(storage_url):
    add_study(storage_url, "ticking", tuning={"trials": 2, "concurrency": 2})
    output = io.StringIO()
    display = ProgressDisplay(Board(get_study(storage_url, "ticking").spec, time.monotonic),
                              Console(file=output, width=400), time.monotonic, heartbeat_seconds=0.5)
    with display:
        time.sleep(0.7)
        display.print("an event")
        time.sleep(0.2)  # less than the interval since the event: no heartbeat yet
        assert output.getvalue().splitlines()[-1] == "an event"
        time.sleep(1.0)
    lines = output.getvalue().splitlines()
    event = lines.index("an event")
    assert 1 <= event <= 2 and 1 <= len(lines) - event - 1 <= 3
    assert all(line.startswith("ticking: ") for i, line in enumerate(lines) if i != event)


def test_a_terminal_gets_a_live_board_with_event_lines_above_it(storage_url):
    add_study(storage_url, "shown", **TWO_FAMILIES, tuning={"trials": 3, "concurrency": 2})
    clock, output = FakeClock(), io.StringIO()
    console = Console(file=output, width=200, force_terminal=True, highlight=False)
    with live_progress(storage_url, stored_spec(storage_url, "shown"), console, clock) as printer:
        assert printer.display.live
        trial_id = add_trial(storage_url, "shown", "tune", "RUNNING", seconds=0)
        printer.on_trial_start(0, [], ray_trial(trial_id, 0))
        printer.on_trial_result(0, [], ray_trial(trial_id, 0), {"turn": 3, "train_loss": 2.25, "val_loss": 2.0})
        clock.now += 75
        recorded = Console(record=True, width=200)
        recorded.print(printer.display.board.render())
    board = recorded.export_text()
    assert "shown: 1m15s elapsed, tuning 0/6" in board
    assert "#0 turn 3 loss 2.250 val ppl 7.39 1m15s" in board
    assert [line.split("│")[1].strip() for line in board.splitlines() if "mogrifier" in line] == ["mogrifier"]
    assert "start\x1b[0m  shown/lstm#0  learning_rate=0.003" in output.getvalue()  # (dim "start")


def test_the_printer_survives_pickling_without_its_display(storage_url):
    """Ray pickles callbacks (with the experiment's state): the display stays in this process."""
    import pickle

    add_study(storage_url, "pickled")
    display = ProgressDisplay(Board(get_study(storage_url, "pickled").spec, time.monotonic),
                              Console(file=io.StringIO()), time.monotonic)
    copy = pickle.loads(pickle.dumps(ProgressPrinter(storage_url, "pickled", display)))
    assert isinstance(copy, ProgressPrinter) and copy.display is None
