"""How a running controller notices that its study was cancelled, and stops its trials."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ray import tune

from tuner.db import TrialRecord, sessions
from tuner.lifecycle import CANCELLED_REASON, cancel_requested

POLL_SECONDS = 2.0


@dataclass(frozen=True)
class CancellationWatch:
    """Reads the cancel request from the database (a plain, picklable object: Ray saves searchers)."""

    url: str
    study: str

    def requested(self) -> bool:
        return cancel_requested(self.url, self.study)

    def record_cancelled(self, optuna_trial_id: int) -> None:
        """A trial stopped by the cancel: failed, and interrupted so that a resume runs it again."""
        with sessions(self.url).begin() as session:
            record = session.get(TrialRecord, optuna_trial_id)
            if record is not None:
                record.fail_reason, record.interrupted = CANCELLED_REASON, True


class CancellationStopper(tune.Stopper):
    """Stops every trial once the study is cancelled, checking the database every few seconds."""

    def __init__(self, watch: CancellationWatch) -> None:
        self._watch = watch
        self._checked_at = 0.0
        self._stop = False

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        if not self._stop and time.monotonic() - self._checked_at >= POLL_SECONDS:
            self._checked_at = time.monotonic()
            self._stop = self._watch.requested()
        return self._stop
