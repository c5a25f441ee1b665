"""Claiming a study is atomic on every backend: of two processes that both read a study as free before either
writes (two launches, a launch and a worker, a resume over REST and a launch, a cancel and a worker), exactly one
wins and the other is told in one line. The race is made certain, not left to luck: each claim's read waits at a
barrier for the other's before either writes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from lm_tuner.tuner.run.controller import StudyConflict, claim_study, this_controller
from lm_tuner.tuner.run.queue import claim_next_study, submit_study
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store import claims
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.lifecycle import StudyStateError, cancel_study, resume_study
from lm_tuner.tuner.store.schema import StudyRecord

DEAD_CONTROLLER = f"{socket.gethostname()}:999999999"


@pytest.fixture
def reads_meet(monkeypatch) -> None:
    """Every claim's first read of a study waits, once read, until the other claim has read it too."""
    barrier = threading.Barrier(2, timeout=30)
    first_read = threading.local()

    def meeting(read: Callable[..., Any]) -> Callable[..., Any]:
        def read_then_meet(*args: Any) -> Any:
            seen = read(*args)
            if not getattr(first_read, "done", False):
                first_read.done = True
                barrier.wait()
            return seen
        return read_then_meet

    monkeypatch.setattr(claims, "seen_study", meeting(claims.seen_study))
    monkeypatch.setattr(claims, "seen_runnable", meeting(claims.seen_runnable))


def _at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Each call's return value, or the exception it raised, the calls made in threads of their own."""
    outcomes: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            outcomes[index] = calls[index]()
        except Exception as error:  # the outcome under test
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


def _stored(url: str) -> StudyRecord:
    with sessions(url)() as session:
        return session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny"))


def _existing(url: str, document: str, status: str, controller: str | None = None) -> None:
    with sessions(url).begin() as session:
        session.add(StudyRecord(name="tiny", status=status, spec=parse_spec(document).model_dump(mode="json"),
                                document=document, families=",lstm,mogrifier,", submitted_via="cli",
                                controller=controller))


def _one_line_conflict(outcome: Any, *expected: str) -> None:
    assert isinstance(outcome, StudyConflict), outcome
    assert "\n" not in str(outcome)
    for text in expected:
        assert text in str(outcome)


@pytest.mark.parametrize("before", ["new", "failed", "running under a dead controller"])
def test_of_two_launches_of_one_study_exactly_one_runs_it(storage_url, tiny_spec, reads_meet, before):
    document = tiny_spec()
    ensure_schema(storage_url)
    if before != "new":
        _existing(storage_url, document, before.split()[0], DEAD_CONTROLLER if before != "failed" else None)
    spec = parse_spec(document)

    outcomes = _at_once(*[lambda: claim_study(storage_url, spec, document, "cli")] * 2)

    assert outcomes.count(None) == 1, outcomes  # one won
    _one_line_conflict(next(o for o in outcomes if o is not None), "study 'tiny' is being run by process",
                       this_controller())
    stored = _stored(storage_url)
    assert (stored.status, stored.controller) == ("running", this_controller())


def test_a_launch_and_a_worker_never_both_run_a_queued_study(storage_url, tiny_spec, reads_meet):
    document = tiny_spec()
    ensure_schema(storage_url)
    spec = parse_spec(document)
    submit_study(storage_url, spec, document)

    launched, worked = _at_once(lambda: claim_study(storage_url, spec, document, "cli"),
                                lambda: claim_next_study(storage_url))

    if launched is None:  # the launch won: the worker found nothing to take
        assert worked is None
    else:  # the worker won: the launch is told who runs it
        assert worked is not None and worked.name == "tiny"
        _one_line_conflict(launched, "is being run by process")
    assert _stored(storage_url).status == "running"


def test_a_resume_over_rest_never_queues_a_study_a_launch_claimed(storage_url, tiny_spec, reads_meet):
    document = tiny_spec()
    ensure_schema(storage_url)
    _existing(storage_url, document, "failed")
    spec = parse_spec(document)

    launched, resumed = _at_once(lambda: claim_study(storage_url, spec, document, "cli"),
                                 lambda: resume_study(storage_url, "tiny"))

    stored = _stored(storage_url)
    if resumed == "queued":  # the resume won: the launch found the study queued, and claimed it after
        assert launched is None and (stored.status, stored.controller) == ("running", this_controller())
    else:  # the launch won: the study is not put in the queue under it, for a worker to run a second time
        assert launched is None and isinstance(resumed, StudyStateError) and "is running" in str(resumed)
        assert (stored.status, stored.controller) == ("running", this_controller())


def test_a_cancel_racing_a_worker_cancels_the_study_it_claimed(storage_url, tiny_spec, reads_meet):
    document = tiny_spec()
    ensure_schema(storage_url)
    submit_study(storage_url, parse_spec(document), document)

    worked, cancelled = _at_once(lambda: claim_next_study(storage_url), lambda: cancel_study(storage_url, "tiny"))

    stored = _stored(storage_url)
    if worked is None:  # the cancel came first: nothing to run
        assert cancelled == "cancelled" and stored.status == "cancelled"
    else:  # the worker claimed it first: its controller is told to stop, never left running a "cancelled" study
        assert cancelled == "cancelling" and stored.status == "cancelling"
