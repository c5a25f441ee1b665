"""A study whose artifact store stops taking files mid-run, on Ray: the trial the store failed is recorded with the
cause and the file, no further trial is started, the study fails saying what happened and how to go on, and once the
store takes files again `tuner resume` runs the trial again and completes the study. On SQLite and PostgreSQL; the
full store is injected in the Ray workers (the trainable this module hands Ray fails its checkpoint writes), and,
where this process may mount a filesystem (root), the command line is run on a real full one."""

from __future__ import annotations

import subprocess
import sys

import pytest
import ray.cloudpickle
import yaml
from sqlalchemy import select

from lm_tuner.tuner.run import tuning
from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.run.trial import run_trial
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.ledger import settled_trials
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord
from tests.conftest import TINY_SPEC
from tests.test_cli import tuner

pytestmark = pytest.mark.slow

ONE_FAMILY = {**TINY_SPEC, "families": ["lstm"], "fixed": {"num_layers": 1},
              "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
              "tuning": {"sampler": "random", "trials": 2, "concurrency": 1}}


def trial_on_a_full_store(config: dict, job: dict) -> None:
    """run_trial in a Ray worker whose artifact store is full: every checkpoint file fails as it is opened."""
    import errno
    import os
    from pathlib import Path
    from unittest import mock

    opened = Path.open

    def full(path: Path, mode: str = "r", *args, **kwargs):
        if "w" in mode and path.name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return opened(path, mode, *args, **kwargs)

    with mock.patch.object(Path, "open", full):
        run_trial(config, job)


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import the tests


def _study(url: str) -> StudyRecord:
    with sessions(url)() as session:
        return session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny"))


def _trials(url: str) -> list[TrialRecord]:
    with sessions(url)() as session:
        return list(session.scalars(select(TrialRecord).where(TrialRecord.study_name == "tiny")
                                    .order_by(TrialRecord.trial_id)))


def test_a_full_store_loses_nothing_and_a_resume_runs_the_trial_again(ray_cluster, storage_url, tmp_path,
                                                                     monkeypatch):
    document = yaml.safe_dump(ONE_FAMILY, sort_keys=False)
    settings = Settings(storage_url, tmp_path / "artifacts")
    monkeypatch.setattr(tuning, "run_trial", trial_on_a_full_store)

    assert launch_study(parse_spec(document), document, settings) == "failed"

    (trial,) = _trials(storage_url)  # the first fault stopped the run: no second trial trained for nothing
    fault = f"artifact store: no space left on device writing {settings.artifact_root}/tiny/lstm/trial-00000/best.pt"
    assert (trial.state, trial.interrupted, trial.fail_reason) == ("FAIL", True, fault)
    assert settled_trials(storage_url, "tiny/lstm") == 0
    assert _study(storage_url).error == f"1 trial(s) stopped: {fault}; once the store takes files again, " \
                                        f"`tuner resume tiny` runs them"

    monkeypatch.setattr(tuning, "run_trial", run_trial)  # the store takes files again
    assert launch_study(parse_spec(document), document, settings) == "complete"

    assert [t.state for t in _trials(storage_url)] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert _study(storage_url).error is None


@pytest.fixture
def full_filesystem(tmp_path):
    """A 200 KiB tmpfs (root only: skipped elsewhere): the first checkpoints fit, the first trial's later ones not."""
    folder = tmp_path / "artifacts"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def test_a_launch_on_a_full_disk_says_so_in_one_line_and_resume_finishes_it(full_filesystem, tmp_path):
    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump(ONE_FAMILY, sort_keys=False))

    launched = tuner("launch", "--space", str(space), "--artifacts", str(full_filesystem), cwd=tmp_path)

    output = launched.stdout + launched.stderr
    assert launched.returncode == 1, output
    assert "Traceback" not in output and "unexpected pos" not in output and "Aborted" not in output
    assert f"trial(s) stopped: artifact store: no space left on device writing {full_filesystem}/tiny/lstm/" in output
    assert not list(full_filesystem.rglob("*.tmp"))  # nothing half-written left to fill the store further

    subprocess.run(["mount", "-o", "remount,size=8m", str(full_filesystem)], check=True)  # space is back
    resumed = tuner("resume", "tiny", "--artifacts", str(full_filesystem), cwd=tmp_path)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "tiny (complete)" in resumed.stdout and "tuning 2/2" in resumed.stdout
