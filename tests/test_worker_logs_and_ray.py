"""`tuner worker` (which `tuner serve` starts): a study that fails as expected is logged in one line (its traceback only
with --debug), and the local Ray the worker started is shut down while the queue is empty, then started again by the
next study."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from lm_tuner.tuner.run.queue import submit_study
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.schema import StudyRecord
from tests.conftest import TINY_SPEC

SESSION_ENVIRONMENT = dict(os.environ)  # before the session's Ray fixture adds variables the worker's Ray must not see
ONE_FAMILY = {**TINY_SPEC, "families": ["lstm"], "fixed": {"num_layers": 1},
              "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
              "tuning": {**TINY_SPEC["tuning"], "sampler": "random", "trials": 1, "concurrency": 1}}
NO_NETWORK = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}  # refused


def queue(url: str, **fields: object) -> None:
    document = {**ONE_FAMILY, **fields}
    ensure_schema(url)
    submit_study(url, parse_spec(yaml.safe_dump(document)), yaml.safe_dump(document))


def worker(tmp_path: Path, url: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "lm_tuner.tuner", "worker", "--storage", url, "--artifacts",
            str(tmp_path / "artifacts"), *options]


def environment(tmp_path: Path, **variables: str) -> dict[str, str]:
    return {**SESSION_ENVIRONMENT, "LM_TUNER_DATA": str(tmp_path / "datasets"), "RAY_AUTH_MODE": "disabled",
            **variables}


def status(url: str, name: str) -> str | None:
    with sessions(url)() as session:
        return session.query(StudyRecord.status).filter(StudyRecord.name == name).scalar()


@pytest.mark.parametrize("debug", [False, True])
def test_a_study_whose_data_cannot_be_downloaded_is_logged_in_one_line_the_traceback_with_debug(tmp_path, debug):
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    queue(url, name="offline", dataset={"name": "ptb"}, parameter_budget=200_000)
    done = subprocess.run(worker(tmp_path, url, "--once", *(["--debug"] if debug else [])), capture_output=True,
                          text=True, timeout=120, env=environment(tmp_path, **NO_NETWORK))
    assert done.returncode == 0, done.stderr
    (failed,) = [line for line in done.stderr.splitlines() if " ERROR " in line]
    archive = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
    assert failed.endswith(f"worker ERROR study offline failed: dataset 'ptb': could not download {archive} "
                           f"(Connection refused); check the network, or to import a copy downloaded elsewhere, `tuner "
                           f"data fetch ptb --from simple-examples.tgz` (the archive at {archive}) or `tuner data "
                           f"fetch ptb --from DIR` with DIR holding ptb.train.txt, ptb.valid.txt and ptb.test.txt laid "
                           f"flat or in the archive's folders (simple-examples/data/)")
    assert ("Traceback" in done.stderr) == debug
    assert status(url, "offline") == "failed"
    assert not (tmp_path / "datasets").exists()


def ray_processes(pid: int) -> list[psutil.Process]:
    """The Ray processes a worker started (its GCS server, raylet, dashboard agents, Ray's Python workers)."""
    names = ("gcs_server", "raylet", "ray::", "ray_", "default_worker", "dashboard", "log_monitor", "monitor.py")
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            command = " ".join(child.cmdline()) or child.name()
        except psutil.Error:
            continue
        if any(name in command for name in names):
            found.append(child)
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


@pytest.mark.slow
def test_an_idle_worker_gives_its_ray_back_and_starts_it_again_for_the_next_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    queue(url, name="first")
    log = (tmp_path / "worker.log").open("w")

    def shutdowns_logged() -> int:
        return (tmp_path / "worker.log").read_text().count("queue empty: Ray shut down until the next study")

    process = subprocess.Popen(worker(tmp_path, url, "--poll-seconds", "0.5", "--ray-idle-seconds", "1"), stdout=log,
                               stderr=subprocess.STDOUT, text=True, env=environment(tmp_path))
    try:
        most_ray_processes, deadline = 0, time.monotonic() + 240
        while status(url, "first") != "complete":
            assert time.monotonic() < deadline and process.poll() is None, (tmp_path / "worker.log").read_text()
            most_ray_processes = max(most_ray_processes, len(ray_processes(process.pid)))
            time.sleep(0.25)
        assert most_ray_processes >= 2  # Ray ran the trials: at least its GCS server and raylet
        # Ray's processes can be gone a moment before `ray.shutdown` returns and the worker writes its line
        wait_for(lambda: not ray_processes(process.pid) and shutdowns_logged() == 1, 30, "Ray to be shut down")
        queue(url, name="second")
        wait_for(lambda: status(url, "second") == "complete", 240, "the second study, on a new Ray")
        wait_for(lambda: not ray_processes(process.pid) and shutdowns_logged() == 2, 30, "Ray to be shut down again")
        assert process.poll() is None  # the worker serves on
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()
