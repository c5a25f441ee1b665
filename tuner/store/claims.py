"""Changing who runs a study, safely on every backend: each change is a conditional UPDATE whose row count says
whether it happened (compare and set), never a read followed by a blind write.

A `SELECT ... FOR UPDATE` between the read and the write does nothing on SQLite, and two processes claiming one
study at once (two launches, a launch and a worker, a resume over REST and a launch) both read it free and both
wrote it theirs. Here the write repeats what was read as its condition: of two claims, the second matches no row
and its caller reads the study again (it is running now) instead of running it a second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import StudyRecord, utcnow


@dataclass(frozen=True)
class SeenStudy:
    """A study's row as a claim read it: what the claim decides on, and the condition of its write."""

    id: int
    name: str
    status: str
    controller: str | None
    spec: dict[str, Any]
    started_at: datetime | None


_SEEN_COLUMNS = (StudyRecord.id, StudyRecord.name, StudyRecord.status, StudyRecord.controller, StudyRecord.spec,
                 StudyRecord.started_at)


def seen_study(url: str, name: str) -> SeenStudy | None:
    """Study `name` as it is now, or None where there is no such study."""
    with sessions(url)() as session:
        row = session.execute(select(*_SEEN_COLUMNS).where(StudyRecord.name == name)).first()
    return None if row is None else SeenStudy(*row)


def seen_runnable(url: str) -> list[SeenStudy]:
    """Queued and running studies, oldest first: what a worker may claim (a running one only if its controller
    died)."""
    with sessions(url)() as session:
        rows = session.execute(select(*_SEEN_COLUMNS).where(StudyRecord.status.in_(("queued", "running")))
                               .order_by(StudyRecord.created_at, StudyRecord.id)).all()
    return [SeenStudy(*row) for row in rows]


def changed_if_unchanged(url: str, seen: SeenStudy, **values: Any) -> bool:
    """Set `values` on the study only if it is still the row `seen` read, with the same status and controller;
    whether it did. False means another process changed the study since it was read: read it again and decide
    again."""
    with sessions(url).begin() as session:
        return session.execute(
            update(StudyRecord)
            .where(StudyRecord.id == seen.id, StudyRecord.status == seen.status,
                   StudyRecord.controller.is_not_distinct_from(seen.controller))
            .values(**values)
            .execution_options(synchronize_session=False)
        ).rowcount == 1


def claimed_if_unchanged(url: str, seen: SeenStudy, controller: str) -> bool:
    """Mark the study running under `controller`, only if no other process changed it since `seen` was read."""
    return changed_if_unchanged(url, seen, status="running", controller=controller, error=None,
                                started_at=func.coalesce(StudyRecord.started_at, utcnow()))


def created_if_absent(url: str, record: StudyRecord) -> bool:
    """Insert a new study; False (and nothing written) where a study of its name exists, made by another process
    since this one looked: the name's unique constraint decides, on every backend."""
    try:
        with sessions(url).begin() as session:
            session.add(record)
    except IntegrityError:
        return False
    return True
