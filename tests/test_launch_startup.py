"""A launch's fixed costs: the plan's warnings are worked out while Ray starts, once the study is claimed (never for
a refused study). None of these tests starts Ray."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from lm_tuner.tuner.run import controller
from lm_tuner.tuner.run.controller import StudyConflict, StudyRefused, connect_ray_while, launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import StudyRecord


class FakeRay:
    """Stands in for connect_ray: records the thread it ran in, and waits (briefly) for the work to start, so a test
    fails rather than hangs where the work is not concurrent."""

    def __init__(self, failure: BaseException | None = None) -> None:
        self.work_started = threading.Event()
        self.threads: list[threading.Thread] = []
        self.overlapped = False
        self._failure = failure

    def __call__(self, settings: Settings) -> None:
        self.threads.append(threading.current_thread())
        self.overlapped = self.work_started.wait(timeout=10)
        if self._failure is not None:
            raise self._failure


def test_the_work_runs_in_another_thread_while_ray_starts_in_this_one(monkeypatch, tmp_path):
    ray = FakeRay()
    monkeypatch.setattr(controller, "connect_ray", ray)
    ran_in: list[threading.Thread] = []

    def work() -> None:
        ran_in.append(threading.current_thread())
        ray.work_started.set()

    connect_ray_while(Settings("sqlite://", tmp_path), work)

    assert ray.overlapped and ray.threads == [threading.current_thread()]
    assert ran_in and ran_in[0] is not threading.current_thread()


def test_a_failure_of_the_work_is_raised_once_ray_has_started(monkeypatch, tmp_path):
    ray = FakeRay()
    monkeypatch.setattr(controller, "connect_ray", ray)

    def work() -> None:
        ray.work_started.set()
        raise ValueError("the warnings could not be worked out")

    with pytest.raises(ValueError, match="could not be worked out"):
        connect_ray_while(Settings("sqlite://", tmp_path), work)
    assert ray.threads  # Ray was started all the same: the caller stops it as after any failure


def test_a_failure_of_rays_start_wins_and_the_work_is_waited_for(monkeypatch, tmp_path):
    ray = FakeRay(failure=ConnectionError("no Ray"))
    monkeypatch.setattr(controller, "connect_ray", ray)
    finished = threading.Event()

    def work() -> None:
        ray.work_started.set()
        finished.wait(timeout=0.2)
        raise ValueError("second")

    with pytest.raises(ConnectionError, match="no Ray"):
        connect_ray_while(Settings("sqlite://", tmp_path), work)
    assert not [t for t in threading.enumerate() if t.name == "while-ray-starts"]


def _launch(document: str, settings: Settings, work) -> str:
    return launch_study(parse_spec(document), document, settings, while_ray_starts=work)


@pytest.fixture
def no_trials(monkeypatch) -> FakeRay:
    """Ray and the tuning stage replaced: the launch runs up to its first trial and stops there."""
    ray = FakeRay()
    monkeypatch.setattr(controller, "connect_ray", ray)
    monkeypatch.setattr(controller, "tune_families", lambda *args: None)
    return ray


def test_the_work_runs_once_the_study_is_claimed(no_trials, sqlite_url, tiny_spec, tmp_path):
    settings = Settings(sqlite_url, tmp_path / "artifacts")
    statuses: list[str] = []

    def work() -> None:
        with sessions(sqlite_url).begin() as session:
            statuses.append(session.scalar(select(StudyRecord.status).where(StudyRecord.name == "tiny")))
        no_trials.work_started.set()

    assert _launch(tiny_spec(), settings, work) == "failed"  # no trial ran: tuning was replaced
    assert statuses == ["running"] and no_trials.overlapped


def test_a_refused_study_starts_no_ray_and_runs_no_work(no_trials, sqlite_url, tiny_spec, tmp_path):
    settings = Settings(sqlite_url, tmp_path / "artifacts")
    work_ran: list[bool] = []

    def work() -> None:
        work_ran.append(True)
        no_trials.work_started.set()

    with pytest.raises(StudyRefused, match="parameter_budget"):
        _launch(tiny_spec(parameter_budget=50), settings, work)
    _launch(tiny_spec(), settings, work)
    work_ran.clear()
    no_trials.threads.clear()
    with sessions(sqlite_url).begin() as session:  # another live process runs it
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny"))
        record.status, record.controller = "running", controller.this_controller()
    with pytest.raises(StudyConflict, match="is being run"):
        _launch(tiny_spec(), settings, work)

    assert not work_ran and not no_trials.threads


def test_ctrl_c_while_ray_starts_waits_for_the_work_and_stops_the_study(no_trials, sqlite_url, tiny_spec, tmp_path,
                                                                       monkeypatch):
    settings = Settings(sqlite_url, tmp_path / "artifacts")
    ray = FakeRay(failure=KeyboardInterrupt())
    monkeypatch.setattr(controller, "connect_ray", ray)
    finished: list[bool] = []

    def work() -> None:
        ray.work_started.set()
        finished.append(True)

    with pytest.raises(KeyboardInterrupt):
        _launch(tiny_spec(), settings, work)

    assert finished
    with sessions(sqlite_url).begin() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny"))
        assert (record.status, record.controller) == ("failed", None) and "interrupted" in record.error
