"""How a running controller notices that its study was cancelled, and stops its trials."""

from __future__ import annotations

import time

from ray import tune

from lm_tuner.tuner.store.ledger import TrialLedger

POLL_SECONDS = 2.0


class CancellationStopper(tune.Stopper):
    """Stops every trial once the study is cancelled, checking the database every few seconds."""

    def __init__(self, ledger: TrialLedger) -> None:
        self._ledger = ledger
        self._checked_at = 0.0
        self._stop = False

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        if not self._stop and time.monotonic() - self._checked_at >= POLL_SECONDS:
            self._checked_at = time.monotonic()
            self._stop = self._ledger.cancel_requested()
        return self._stop
