"""Faults injected into real processes: every trial ends accounted for, none lost, none left RUNNING."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from sqlalchemy import select

from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.schema import TrialRecord, TurnRecord
from tests.conftest import TINY_SPEC

pytestmark = pytest.mark.slow

SLOW = {**TINY_SPEC, "families": ["lstm"], "fixed": {"num_layers": 1},
        "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
        "training": {**TINY_SPEC["training"], "turns": 4, "steps_per_turn": 300},
        "tuning": {"sampler": "random", "trials": 1, "concurrency": 1, "max_retries": 2}}


def trial_workers() -> list[int]:
    """Process ids of the Ray actors running trials (Ray titles them after the trainable)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"ImplicitFunc" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


def wait_for(condition, seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


def test_a_killed_trial_worker_resumes_from_its_last_turn(ray_cluster, postgres_url, tmp_path):
    url = postgres_url  # PostgreSQL never reuses a deleted row's id: the last check relies on that
    document = yaml.safe_dump(SLOW)
    settings = Settings(url, tmp_path / "artifacts")
    ensure_schema(url)
    outcome: dict[str, str] = {}
    controller = threading.Thread(
        target=lambda: outcome.update(status=launch_study(parse_spec(document), document, settings)))
    controller.start()

    def turns() -> list[int]:
        with sessions(url)() as session:
            return list(session.scalars(select(TurnRecord.turn).order_by(TurnRecord.turn)))

    wait_for(lambda: turns() == [1], 180, "the trial never reported its first turn")
    with sessions(url)() as session:
        first_report = session.scalar(select(TurnRecord.id).where(TurnRecord.turn == 1))
    (worker,) = trial_workers()
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: any(pid != worker for pid in trial_workers()), 120, "the trial was not restarted")
    controller.join(timeout=300)
    assert outcome["status"] == "complete"

    (trial,) = optuna.load_study(study_name="tiny/lstm", storage=url).get_trials()
    assert trial.state == TrialState.COMPLETE
    assert turns() == [1, 2, 3, 4]
    with sessions(url)() as session:
        assert session.get(TrialRecord, trial._trial_id).state == "COMPLETE"
        # Resumed from its latest checkpoint: turn 1 was not trained (and reported) a second time.
        assert session.scalar(select(TurnRecord.id).where(TurnRecord.turn == 1)) == first_report
    assert sorted(trial.intermediate_values) == [1, 2, 3, 4]


class RayCluster:
    """A Ray head and a second node on this machine, each a `ray start --block` process of its own."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # A short private folder: Ray's socket paths must stay under the 107-character limit.
        self.head = self._start("--head", f"--port={self.port}", "--num-cpus=1", "--include-dashboard=false",
                                f"--temp-dir={tempfile.mkdtemp(prefix='ray-', dir='/tmp')}")
        wait_for(self._up, 90, "the Ray head did not start")
        self.second = self._start(f"--address={self.address}", "--num-cpus=1")
        wait_for(lambda: self.nodes() == 2, 90, "the second Ray node did not join")

    def _start(self, *arguments: str) -> subprocess.Popen:
        ray = Path(sys.executable).parent / "ray"
        return subprocess.Popen([str(ray), "start", "--block", "--disable-usage-stats", *arguments],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "RAY_AUTH_MODE": "disabled"})

    def _up(self) -> bool:
        return self.nodes() >= 1

    def nodes(self) -> int:
        ray = Path(sys.executable).parent / "ray"
        run = subprocess.run([str(ray), "status", f"--address={self.address}"], capture_output=True, text=True,
                             env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        return run.stdout.count("node_") if run.returncode == 0 else 0

    def stop_second_node(self) -> None:
        os.killpg(self.second.pid, signal.SIGKILL)
        self.second.wait()

    def stop(self) -> None:
        # `ray start --block` shuts down gracefully in about 30 s; the test's data is in the database, so a
        # short grace then SIGKILL to each node's whole process group is enough.
        for process in (self.second, self.head):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def ray_two_nodes():
    cluster = RayCluster()
    yield cluster
    cluster.stop()


def launch_process(space: Path, url: str, artifacts: Path, address: str, *command: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lm_tuner.tuner", *(command or ("launch", "--space", str(space))), "--storage", url,
         "--artifacts", str(artifacts), "--address", address],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"})


def states(url: str) -> list[TrialState]:
    return [t.state for t in optuna.load_study(study_name="tiny/lstm", storage=url).get_trials()]


def running_trials(url: str) -> int:
    with sessions(url)() as session:
        return len(session.scalars(select(TrialRecord.trial_id).where(TrialRecord.state == "RUNNING")).all())


def test_controller_killed_on_a_cluster_then_resumed(ray_two_nodes, postgres_url, tmp_path):
    spec = {**SLOW, "tuning": {**SLOW["tuning"], "trials": 3, "concurrency": 2}}
    space = tmp_path / "study.yaml"
    space.write_text(yaml.safe_dump(spec))
    ensure_schema(postgres_url)
    controller = launch_process(space, postgres_url, tmp_path / "artifacts", ray_two_nodes.address)
    wait_for(lambda: running_trials(postgres_url) == 2, 180, "two trials never ran at once")
    controller.send_signal(signal.SIGKILL)
    controller.wait()

    resumed = launch_process(space, postgres_url, tmp_path / "artifacts", ray_two_nodes.address, "resume", "tiny")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()
    final = states(postgres_url)
    assert final.count(TrialState.COMPLETE) == 3  # the budget, exactly: no trial lost, none counted twice
    assert TrialState.RUNNING not in final
    with sessions(postgres_url)() as session:
        records = session.scalars(select(TrialRecord)).all()
    interrupted = [r for r in records if r.interrupted]
    assert len(interrupted) == 2 and all(r.state == "FAIL" for r in interrupted)
    assert len(records) == len(final) == 5


def test_losing_a_node_moves_its_trial_to_the_head(ray_two_nodes, postgres_url, tmp_path):
    spec = {**SLOW, "tuning": {**SLOW["tuning"], "trials": 2, "concurrency": 2}}
    space = tmp_path / "study.yaml"
    space.write_text(yaml.safe_dump(spec))
    ensure_schema(postgres_url)
    controller = launch_process(space, postgres_url, tmp_path / "artifacts", ray_two_nodes.address)
    wait_for(lambda: running_trials(postgres_url) == 2, 180, "two trials never ran at once")
    ray_two_nodes.stop_second_node()
    assert controller.wait(timeout=600) == 0, controller.stderr.read()
    final = states(postgres_url)
    assert final == [TrialState.COMPLETE, TrialState.COMPLETE]  # the lost trial was restarted, not replaced
    assert running_trials(postgres_url) == 0
