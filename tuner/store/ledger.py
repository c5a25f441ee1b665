"""The project's record of each trial's state and value, written beside Optuna's at every transition.

Optuna's tables stay the tuner's truth; this copy in lmt_trials lets the API count, rank and page
thousands of trials from one indexed table. Every state change of a trial goes through here.
"""

from __future__ import annotations

from dataclasses import dataclass

from optuna.trial import TrialState
from sqlalchemy import func, select

from lm_tuner.trainers.artifact_store import STORE_FAULT
from lm_tuner.tuner.store.engine import optuna_storage, sessions
from lm_tuner.tuner.store.lifecycle import CANCELLED_REASON, cancel_requested
from lm_tuner.tuner.store.optuna_internals import storage_trial_id
from lm_tuner.tuner.store.schema import TrialRecord


@dataclass(frozen=True)
class TrialLedger:
    """Writes trial transitions for one study (a plain, picklable object: Ray saves searchers)."""

    url: str
    study: str

    def ended(self, trial_id: int, state: TrialState, value: float | None = None, *, reason: str | None = None,
              interrupted: bool = False) -> None:
        record_end(self.url, trial_id, state, value, reason=reason, interrupted=interrupted)

    def cancel_requested(self) -> bool:
        return cancel_requested(self.url, self.study)

    def cancelled(self, trial_id: int) -> None:
        """A trial stopped by the cancel: failed, and interrupted so that a resume runs it again."""
        self.ended(trial_id, TrialState.FAIL, reason=CANCELLED_REASON, interrupted=True)


def record_end(url: str, trial_id: int, state: TrialState, value: float | None = None, *, reason: str | None = None,
               interrupted: bool = False) -> None:
    with sessions(url).begin() as session:
        record = session.get(TrialRecord, trial_id)
        if record is None:
            return
        record.state, record.value = state.name, value if state == TrialState.COMPLETE else None
        if reason is not None:
            record.fail_reason = reason
        record.interrupted = record.interrupted or interrupted


def record_interrupted(url: str, study: str, family: str, trial_id: int, number: int, seed: int, reason: str) -> None:
    """A trial its controller left RUNNING: failed and interrupted (run again on resume).

    The trial may have no record yet when the controller stopped between Optuna's ask and our write.
    """
    with sessions(url).begin() as session:
        if session.get(TrialRecord, trial_id) is None:
            session.add(TrialRecord(trial_id=trial_id, study_name=study, family=family, number=number, seed=seed))
    record_end(url, trial_id, TrialState.FAIL, reason=reason, interrupted=True)


def settled_trials(url: str, optuna_name: str) -> int:
    """Finished trials of an Optuna study that count towards its budget (interrupted ones do not)."""
    storage = optuna_storage(url)
    try:
        study_id = storage.get_study_id_from_name(optuna_name)
    except KeyError:
        return 0
    finished = {storage_trial_id(t) for t in storage.get_all_trials(
        study_id, deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))}
    with sessions(url)() as session:
        interrupted = set(session.scalars(select(TrialRecord.trial_id).where(
            TrialRecord.trial_id.in_(finished), TrialRecord.interrupted)))
    return len(finished - interrupted)


def last_trial_id(url: str, study: str) -> int:
    """The highest trial id the study has (0 for none): trials made later have higher ids."""
    with sessions(url)() as session:
        return session.scalar(select(func.coalesce(func.max(TrialRecord.trial_id), 0))
                              .where(TrialRecord.study_name == study))


def store_faults(url: str, study: str, after: int = 0) -> list[str]:
    """The failure reasons of the study's trials (ids above `after`) that the artifact store failed (full,
    read-only): not settled, they run again when the study is resumed. Oldest first."""
    with sessions(url)() as session:
        return list(session.scalars(select(TrialRecord.fail_reason).where(
            TrialRecord.study_name == study, TrialRecord.trial_id > after, TrialRecord.interrupted,
            TrialRecord.fail_reason.startswith(STORE_FAULT, autoescape=True)).order_by(TrialRecord.trial_id)))


def complete_tuning_trials(url: str, study: str) -> int:
    with sessions(url)() as session:
        return session.scalar(select(func.count()).select_from(TrialRecord).where(
            TrialRecord.study_name == study, TrialRecord.stage == "tune", TrialRecord.state == "COMPLETE"))
