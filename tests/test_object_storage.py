"""Artifacts in S3-compatible object storage, against a real server (moto's, in a process of its own so that the
Ray workers a launch starts reach it over HTTP like any S3): atomic writes, a study whose checkpoints go there,
a trial killed mid-run resuming from its checkpoint there, `tuner best --download` and the REST download."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import httpx
import psutil
import pytest
import yaml
from sqlalchemy import select

from lm_tuner.trainers import artifact_store
from lm_tuner.tuner.settings import ObjectStoreUrl, Settings, artifact_root
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.schema import CheckpointRecord, EvaluationRecord, TrialRecord, TurnRecord
from lm_tuner.tuner.store.storage import Storage
from tests.conftest import TINY_SPEC, serve_app
from tests.test_fault_tolerance import free_port, wait_for

BUCKET = "lm-tuner-test"
ROOT = f"s3://{BUCKET}/artifacts"
STUDY = {**TINY_SPEC, "families": ["lstm"], "fixed": {"num_layers": 1},
         "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
         "training": {**TINY_SPEC["training"], "turns": 4, "steps_per_turn": 150},
         "tuning": {"sampler": "random", "trials": 1, "concurrency": 1, "max_retries": 2},
         "evaluation": {"bptt": 10, "temperature": False}}  # the test protocol reads the best checkpoint back


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on a free port, with the bucket, and this process's environment pointing at it (the
    processes the tests start inherit it)."""
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    variables = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        wait_for(lambda: _answers(variables["AWS_ENDPOINT_URL"]), 30, "the S3 server did not start")
        import fsspec

        fsspec.filesystem("s3").mkdir(BUCKET)
        yield fsspec.filesystem("s3")
    finally:
        server.terminate()
        server.wait(timeout=30)
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


def _answers(endpoint: str) -> bool:
    try:
        return httpx.get(endpoint, timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


def test_locations_parse_as_object_storage_or_local_paths(tmp_path):
    assert artifact_root("s3://bucket/prefix/") == ObjectStoreUrl("s3://bucket/prefix")
    assert artifact_root(f"file://{tmp_path}") == tmp_path and artifact_root(tmp_path) == tmp_path
    assert artifact_store.join("s3://bucket/prefix", "a/b.pt") == "s3://bucket/prefix/a/b.pt"
    assert artifact_store.join(tmp_path, "a/b.pt") == tmp_path / "a" / "b.pt"
    root = ObjectStoreUrl("s3://bucket/prefix")
    assert (root / "study/../study/best.pt").resolve().is_relative_to(root)
    assert not (root / "../other/best.pt").resolve().is_relative_to(root)
    assert not ObjectStoreUrl("s3://bucket/prefix-other/x").is_relative_to(root)


def test_an_object_appears_whole_or_not_at_all(s3_server):
    location = f"{ROOT}/atomic/file.bin"
    payload = os.urandom(3 << 20)
    artifact_store.write_atomically(location, lambda path: path.write_bytes(payload))
    assert artifact_store.exists(location) and artifact_store.size(location) == len(payload)
    assert b"".join(artifact_store.chunks(location, 1 << 20)) == payload == s3_server.cat(location)

    def killed_halfway(path: Path) -> None:
        path.write_bytes(payload[:1000])
        raise KeyboardInterrupt  # what a signal raises in the middle of a write

    with pytest.raises(KeyboardInterrupt):
        artifact_store.write_atomically(f"{ROOT}/atomic/half.bin", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        artifact_store.write_atomically(location, killed_halfway)
    assert not artifact_store.exists(f"{ROOT}/atomic/half.bin")
    assert s3_server.cat(location) == payload  # the old object, untouched
    folder = f"{BUCKET}/artifacts/atomic"
    assert s3_server.ls(folder, detail=False, refresh=True) == [f"{folder}/file.bin"]  # no temporary object


def test_a_prefix_holds_files_until_its_tree_is_removed(s3_server):
    folder = f"{ROOT}/leftover"
    assert not artifact_store.holds_files(folder)
    artifact_store.write_atomically(f"{folder}/lstm/trial-00000/latest.pt", lambda path: path.write_bytes(b"state"))
    assert artifact_store.holds_files(folder) and not artifact_store.holds_files(f"{ROOT}/leftove")
    artifact_store.remove_tree(folder)
    assert not artifact_store.holds_files(folder)


def test_a_study_on_object_storage_resumes_a_killed_trial_and_serves_its_checkpoint(s3_server, postgres_url,
                                                                                     tmp_path):
    url = postgres_url  # PostgreSQL never reuses a deleted row's id: the resume check relies on that
    ensure_schema(url)
    space = tmp_path / "study.yaml"
    space.write_text(yaml.safe_dump(STUDY))
    log = tmp_path / "launch.log"
    with log.open("w") as output:
        launch = _tuner("launch", "--space", str(space), "--storage", url, home=tmp_path, output=output)
    try:
        wait_for(lambda: _turns(url) == [1], 180, "the trial never reported its first turn")
        with sessions(url)() as session:
            first_report = session.scalar(select(TurnRecord.id).where(TurnRecord.turn == 1))
        (worker,) = _trial_workers(launch.pid)
        os.kill(worker, signal.SIGKILL)
        assert launch.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)  # the launch and the Ray it started
            launch.wait()
    assert _turns(url) == [1, 2, 3, 4]
    with sessions(url)() as session:
        (trial,) = session.scalars(select(TrialRecord)).all()
        checkpoint = session.get(CheckpointRecord, trial.trial_id)
        evaluation = session.scalar(select(EvaluationRecord).where(EvaluationRecord.trial_id == trial.trial_id))
        # The retried trial read its latest checkpoint from object storage: turn 1 was not trained again.
        assert trial.state == "COMPLETE" and session.scalar(
            select(TurnRecord.id).where(TurnRecord.turn == 1)) == first_report
        assert evaluation is not None and evaluation.test_loss > 0  # the test protocol read the best one back
    folder = f"{BUCKET}/artifacts/tiny/lstm/trial-00000"
    assert sorted(s3_server.ls(folder, detail=False, refresh=True)) == [f"{folder}/best.pt", f"{folder}/latest.pt"]
    assert not (tmp_path / "home" / "artifacts").exists()  # nothing went to the local default
    stored = s3_server.cat(f"{ROOT}/{checkpoint.path}")
    assert artifact_store.sha256(f"{ROOT}/{checkpoint.path}") == checkpoint.sha256
    assert len(stored) == checkpoint.size_bytes

    # `tuner best` finds the store the study ran with (recorded in the database) and downloads the object's bytes.
    best = _tuner("best", "tiny", "--storage", url, "--download", str(tmp_path / "downloads"), home=tmp_path)
    output, errors = best.communicate(timeout=120)
    assert best.returncode == 0, errors
    (downloaded,) = (tmp_path / "downloads").iterdir()
    assert downloaded.read_bytes() == stored and f"{ROOT}/{checkpoint.path}" in output
    # and the one named on the command line: a URL, not a folder called "s3:"
    named = _tuner("best", "tiny", "--storage", url, "--artifacts", ROOT, "--download", str(tmp_path / "named"),
                   home=tmp_path)
    output, errors = named.communicate(timeout=120)
    assert named.returncode == 0, errors
    assert [file.read_bytes() for file in (tmp_path / "named").iterdir()] == [stored]
    assert f"{ROOT}/{checkpoint.path}" in output

    # The API streams it from object storage, and refuses a stored path that leaves the artifact store.
    s3_server.pipe(f"{BUCKET}/secret.txt", b"not yours")
    with serve_app(Settings(url, artifact_root(ROOT))) as base, httpx.Client(base_url=base, timeout=60) as client:
        response = client.get(f"/trials/{trial.trial_id}/checkpoint")
        assert response.status_code == 200 and response.content == stored
        assert response.headers["x-checkpoint-sha256"] == checkpoint.sha256
        assert "tiny-lstm-0.pt" in response.headers["content-disposition"]
        for path, refused in (("../secret.txt", 403), ("tiny/../../secret.txt", 403), ("tiny/none.pt", 404)):
            with sessions(url).begin() as session:
                session.get(CheckpointRecord, trial.trial_id).path = path
            assert client.get(f"/trials/{trial.trial_id}/checkpoint").status_code == refused, path

    # Deleting the study removes its objects, and nothing else in the bucket.
    Storage(url).delete("tiny", artifact_root(ROOT))
    assert not s3_server.exists(f"{BUCKET}/artifacts/tiny/lstm/trial-00000/best.pt")
    assert s3_server.cat(f"{BUCKET}/secret.txt") == b"not yours"


def _tuner(*arguments: str, home: Path, output: IO[str] | int = subprocess.PIPE) -> subprocess.Popen:
    """A `tuner` command with the artifact store in object storage (its own local Ray, started with this
    environment: its workers reach the S3 server too)."""
    return subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", *arguments], stdout=output,
                            stderr=subprocess.STDOUT if output != subprocess.PIPE else subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, "LM_TUNER_ARTIFACTS": ROOT, "LM_TUNER_HOME": str(home / "home"),
                                 "RAY_AUTH_MODE": "disabled"})


def _turns(url: str) -> list[int]:
    with sessions(url)() as session:
        return list(session.scalars(select(TurnRecord.turn).order_by(TurnRecord.turn)))


def _trial_workers(launcher: int) -> list[int]:
    """The Ray actors running trials (titled after the trainable) among the processes the launch started."""
    found = []
    for child in psutil.Process(launcher).children(recursive=True):
        try:
            if "ImplicitFunc" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:  # it ended while we looked
            continue
    return found
