"""Where the live progress of `tuner launch` goes. On a terminal: a rich Live area under the event lines,
redrawn every second (the elapsed time ticks even when no trial reports). Elsewhere (a pipe, a log file): the
event lines only, and the board in one line whenever nothing was printed for HEARTBEAT_SECONDS, so that a log
is never silent for longer."""

from __future__ import annotations

import threading
from collections.abc import Callable

from rich.console import Console
from rich.live import Live

from lm_tuner.tuner.cli.live_board import Board

HEARTBEAT_SECONDS = 30.0

REFRESHES_PER_SECOND = 1.0


class ProgressDisplay:
    """Shows a Board while it is entered (a context manager); `print` puts an event line above it."""

    def __init__(self, board: Board, console: Console, clock: Callable[[], float],
                 heartbeat_seconds: float = HEARTBEAT_SECONDS) -> None:
        self.board = board
        self._console = console
        self._clock = clock
        self._heartbeat_seconds = heartbeat_seconds
        self._last_output = clock()
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None

    @property
    def live(self) -> bool:
        """Whether the board is drawn live (on a terminal), rather than as heartbeat lines."""
        return self._console.is_terminal and not self._console.is_dumb_terminal

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            # Lines printed meanwhile (also by other code, through stdout and stderr) appear above the area.
            self._live = Live(console=self._console, get_renderable=self.board.render, transient=True,
                              refresh_per_second=REFRESHES_PER_SECOND)
            self._live.start()
        else:
            self._stop.clear()
            self._beats = threading.Thread(target=self._beat_until_stopped, name="progress-heartbeat", daemon=True)
            self._beats.start()
        return self

    def __exit__(self, *exception: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._beats is not None:
            self._stop.set()
            self._beats.join()
            self._beats = None

    def print(self, line: str) -> None:
        """An event line (rich markup): above the live area, or a line of the log."""
        with self._lock:
            self._console.print(line, soft_wrap=True)  # while live, rich puts it above the live area
            self._last_output = self._clock()

    def beat(self) -> bool:
        """Prints the board in one line if nothing was printed for the heartbeat's interval; whether it did."""
        with self._lock:
            if self._live is not None or self._clock() - self._last_output < self._heartbeat_seconds:
                return False
            self._console.print(self.board.line(), soft_wrap=True, markup=False)
            self._last_output = self._clock()
            return True

    def seconds_to_beat(self) -> float:
        with self._lock:
            return max(self._last_output + self._heartbeat_seconds - self._clock(), 0.0)

    def _beat_until_stopped(self) -> None:
        # Wakes when the next heartbeat is due (an event line in between postpones it), at least once a second.
        while not self._stop.wait(min(max(self.seconds_to_beat(), 0.05), 1.0)):
            self.beat()
