"""Changing a study's life: cancel it, put it back in the queue, delete it with its artifacts."""

from __future__ import annotations

import optuna
from sqlalchemy import delete, exists, select

from lm_tuner.trainers import artifact_store
from lm_tuner.tuner.settings import ArtifactRoot
from lm_tuner.tuner.store import claims
from lm_tuner.tuner.store.engine import optuna_storage, sessions
from lm_tuner.tuner.store.optuna_names import optuna_studies_of
from lm_tuner.tuner.store.schema import CheckpointRecord, StudyRecord, TrialCountRecord, TrialRecord, TurnRecord, utcnow

CANCELLED_REASON = "cancelled by the user"
RESUMABLE = ("failed", "cancelled")


class StudyStateError(RuntimeError):
    """The study is in a state that does not allow the requested change."""


def cancel_study(url: str, name: str) -> str:
    """Stop a study: a queued one at once, a running one as soon as its controller notices (seconds).

    Returns the new status. Raises KeyError for an unknown study and StudyStateError for one that
    has already ended. A worker claiming the study meanwhile is noticed (tuner.store.claims): the study is then
    running, and is marked cancelling.
    """
    while True:
        seen = claims.seen_study(url, name)
        if seen is None:
            raise KeyError(name)
        if seen.status == "queued":
            change = {"status": "cancelled", "finished_at": utcnow(), "error": CANCELLED_REASON}
        elif seen.status == "running":
            change = {"status": "cancelling"}
        elif seen.status == "cancelling":
            return seen.status
        else:
            raise StudyStateError(f"study {name!r} is {seen.status}; only queued or running studies can be "
                                  f"cancelled")
        if claims.changed_if_unchanged(url, seen, **change):
            return change["status"]


def resume_study(url: str, name: str) -> str:
    """Put a failed or cancelled study back in the queue: the next worker continues it as `tuner resume` would
    (its interrupted trials run again, finished ones are kept). Returns the new status, "queued".

    Raises KeyError for an unknown study and StudyStateError for one that is queued, running or complete (a launch
    that claims it meanwhile wins: the study is running, and stays out of the queue).
    """
    while True:
        seen = claims.seen_study(url, name)
        if seen is None:
            raise KeyError(name)
        if seen.status not in RESUMABLE:
            raise StudyStateError(f"study {name!r} is {seen.status}; only {' or '.join(RESUMABLE)} studies can be "
                                  f"resumed")
        if claims.changed_if_unchanged(url, seen, status="queued", controller=None, finished_at=None, error=None):
            return "queued"


def cancel_requested(url: str, name: str) -> bool:
    with sessions(url)() as session:
        return session.scalar(select(StudyRecord.status).where(StudyRecord.name == name)) == "cancelling"


def delete_study(url: str, name: str, artifact_root: ArtifactRoot) -> None:
    """Remove a study, its trials (Optuna's and ours), learning curves, checkpoints and artifact folder."""
    with sessions(url)() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
    if record is None:
        raise KeyError(name)
    if record.status in ("running", "cancelling"):
        raise StudyStateError(f"study {name!r} is {record.status}; cancel it and wait until it has stopped")
    # The files first: a study whose folder could not be removed stays, to be deleted again, rather than leave
    # files that a new study of the same name would find (launching one refuses while they are there).
    folder = (artifact_root / name).resolve()
    if folder.is_relative_to(artifact_root.resolve()) and folder != artifact_root.resolve():
        artifact_store.remove_tree(folder)
    storage = optuna_storage(url)
    for optuna_name in optuna_studies_of(url, name):  # every family's, and their reruns, stage 2 and sensitivity
        optuna.delete_study(study_name=optuna_name, storage=storage)
    with sessions(url).begin() as session:
        trial_ids = select(TrialRecord.trial_id).where(TrialRecord.study_name == name)
        session.execute(delete(TurnRecord).where(TurnRecord.trial_id.in_(trial_ids)))
        session.execute(delete(CheckpointRecord).where(CheckpointRecord.trial_id.in_(trial_ids)))
        session.execute(delete(TrialRecord).where(TrialRecord.study_name == name))
        session.execute(delete(TrialCountRecord).where(TrialCountRecord.study_name == name))  # zeros by now
        session.execute(delete(StudyRecord).where(StudyRecord.name == name))


def release_unstarted_name(url: str, name: str, spec: dict, artifact_root: ArtifactRoot) -> bool:
    """Delete study `name` if it ended (failed or cancelled) before any trial ran and `spec` differs from its
    own, so that a corrected spec can be launched under the same name. Returns whether it did."""
    with sessions(url)() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == name))
        if record is None or record.status not in ("failed", "cancelled") or record.spec == spec:
            return False
        if session.scalar(select(exists().where(TrialRecord.study_name == name))):
            return False
    delete_study(url, name, artifact_root)
    return True
