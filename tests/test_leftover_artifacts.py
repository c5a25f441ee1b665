"""A study's checkpoints stay in one artifact store.

Checkpoints left under a study's name by an earlier study of that name (its database deleted, or the study
deleted from another database, or a delete that stopped half-way) would be taken by the new study's trials for their
own: a trial resumes from the `latest.pt` in its folder. Every way a study starts refuses them, and a delete removes
the files before the rows, so that a failed removal leaves a study to delete again rather than stray files. A study
that has run continues in the store it wrote to: by default, and a continuation in another one is refused."""

from __future__ import annotations

import httpx
import pytest
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from lm_tuner.trainers import artifact_store
from lm_tuner.tuner.cli.app import app
from lm_tuner.tuner.run.controller import StudyConflict, refuse_mismatched_artifacts
from lm_tuner.tuner.run.queue import run_worker, submit_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store import in_study_store
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.lifecycle import delete_study
from lm_tuner.tuner.store.schema import StudyRecord
from tests.conftest import TINY_SPEC, serve_app
from tests.test_cli import tuner
from tests.test_progress import add_study, add_trial

LEFTOVER = "holds checkpoints of an earlier study named 'tiny', of which this database has no trial"


def leave_checkpoint(artifacts, study: str = "tiny") -> None:
    folder = artifacts / study / "lstm" / "trial-00000"
    folder.mkdir(parents=True)
    (folder / "latest.pt").write_bytes(b"an earlier study's training state")


def status_of(url: str, name: str) -> tuple[str, str | None] | None:
    with sessions(url)() as session:
        found = session.execute(select(StudyRecord.status, StudyRecord.error).where(StudyRecord.name == name)).first()
    return None if found is None else tuple(found)


def test_a_launch_refuses_checkpoints_of_an_earlier_study_of_its_name(sqlite_url, tmp_path, tiny_spec):
    artifacts = tmp_path / "artifacts"
    ensure_schema(sqlite_url)
    (artifacts / "tiny" / "lstm").mkdir(parents=True)  # empty folders are no checkpoints
    leave_checkpoint(artifacts, "tiny-other")  # another study's files are not this one's
    refuse_mismatched_artifacts(sqlite_url, "tiny", artifacts)
    leave_checkpoint(artifacts)
    space = tmp_path / "tiny.yaml"
    space.write_text(tiny_spec())
    # a process of its own, as a user runs it: a launch in this one would shut down the tests' Ray on its way out
    refused = tuner("launch", "--space", str(space), "--storage", sqlite_url, "--artifacts", str(artifacts),
                    cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert LEFTOVER in " ".join(refused.stderr.split()) and str(artifacts / "tiny") in refused.stderr
    assert status_of(sqlite_url, "tiny") is None  # nothing stored


def test_a_study_with_trials_keeps_its_checkpoints(sqlite_url, tmp_path):
    artifacts = tmp_path / "artifacts"
    leave_checkpoint(artifacts)
    add_study(sqlite_url, "tiny")
    with pytest.raises(StudyConflict, match=LEFTOVER):
        refuse_mismatched_artifacts(sqlite_url, "tiny", artifacts)
    add_trial(sqlite_url, "tiny", "tune", "RUNNING")  # its own trial's checkpoint: resumed, as it should be
    refuse_mismatched_artifacts(sqlite_url, "tiny", artifacts)


def test_a_study_continues_in_the_store_it_wrote_to(sqlite_url, tmp_path):
    first, other = (tmp_path / "first").resolve(), (tmp_path / "other").resolve()
    add_study(sqlite_url, "tiny")
    add_trial(sqlite_url, "tiny", "tune", "COMPLETE")
    with sessions(sqlite_url).begin() as session:
        session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny")).artifact_root = str(first)
    settings = Settings.from_options(sqlite_url, None)
    assert in_study_store(settings, "tiny", None).artifact_root == first  # launch, resume, sensitivity, best, delete
    assert in_study_store(settings, "tiny", str(other)).artifact_root == other
    assert in_study_store(settings, "new", None).artifact_root == settings.artifact_root
    refuse_mismatched_artifacts(sqlite_url, "tiny", first)
    refused = tuner("resume", "tiny", "--storage", sqlite_url, "--artifacts", str(other), cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert f"study 'tiny' wrote its checkpoints to {first}, not {other}; continue it with --artifacts {first}" in \
        " ".join(refused.stderr.split())
    assert refused.stdout == ""  # no header naming the other store as the study's
    assert status_of(sqlite_url, "tiny") == ("running", None)  # untouched


def test_a_submission_over_rest_is_a_conflict_and_a_queued_study_fails(sqlite_url, tmp_path):
    artifacts = tmp_path / "artifacts"
    leave_checkpoint(artifacts)
    with serve_app(Settings(sqlite_url, artifacts)) as base:
        answer = httpx.post(f"{base}/studies", content=yaml.safe_dump(TINY_SPEC), timeout=60)
    assert answer.status_code == 409 and LEFTOVER in answer.json()["detail"]
    assert status_of(sqlite_url, "tiny") is None
    ensure_schema(sqlite_url)
    submit_study(sqlite_url, parse_spec(yaml.safe_dump(TINY_SPEC)), "document")  # queued before the files came
    assert run_worker(Settings(sqlite_url, artifacts), once=True) == 1
    status, error = status_of(sqlite_url, "tiny")
    assert status == "failed" and LEFTOVER in error


def test_a_delete_that_cannot_remove_the_files_keeps_the_study(sqlite_url, tmp_path, monkeypatch):
    artifacts = tmp_path / "artifacts"
    leave_checkpoint(artifacts)
    add_study(sqlite_url, "tiny", status="complete")
    add_trial(sqlite_url, "tiny", "tune", "COMPLETE")
    remove_tree = artifact_store.remove_tree

    def refused(location):
        raise PermissionError(13, "Permission denied", str(location))

    monkeypatch.setattr(artifact_store, "remove_tree", refused)
    with pytest.raises(PermissionError):
        delete_study(sqlite_url, "tiny", artifacts)
    assert status_of(sqlite_url, "tiny") == ("complete", None)
    with serve_app(Settings(sqlite_url, artifacts)) as base:
        answer = httpx.delete(f"{base}/studies/tiny", timeout=60)
    assert answer.status_code == 500 and "Permission denied" in answer.json()["detail"]
    assert answer.json()["detail"].endswith("the study is kept: delete it again once the artifact store allows it")
    assert status_of(sqlite_url, "tiny") == ("complete", None)
    monkeypatch.setattr(artifact_store, "remove_tree", remove_tree)
    delete_study(sqlite_url, "tiny", artifacts)
    assert status_of(sqlite_url, "tiny") is None and not artifact_store.holds_files(artifacts)


def test_local_folders_hold_files_only_where_a_file_is(tmp_path):
    assert not artifact_store.holds_files(tmp_path / "missing")
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert not artifact_store.holds_files(tmp_path / "a")
    (tmp_path / "a" / "b" / "c.pt").write_bytes(b"")
    assert artifact_store.holds_files(tmp_path / "a")
    artifact_store.remove_tree(tmp_path / "a")
    artifact_store.remove_tree(tmp_path / "a")  # nothing there is not an error
    assert not (tmp_path / "a").exists()


def test_a_delete_removes_the_files_where_the_study_wrote_them(sqlite_url, tmp_path, monkeypatch):
    elsewhere = tmp_path / "big-disk"
    leave_checkpoint(elsewhere)
    add_study(sqlite_url, "tiny", status="complete")
    with sessions(sqlite_url).begin() as session:  # as the controller records it (`launch --artifacts ...`)
        session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny")).artifact_root = str(elsewhere)
    monkeypatch.setenv("LM_TUNER_HOME", str(tmp_path / "home"))  # the default store is another
    kept = CliRunner().invoke(app, ["delete", "tiny", "--storage", sqlite_url], input="n\n")
    assert kept.exit_code == 1 and f"Delete study 'tiny' and its checkpoints in {elsewhere / 'tiny'}?" in kept.output
    assert status_of(sqlite_url, "tiny") == ("complete", None) and artifact_store.holds_files(elsewhere)
    deleted = CliRunner().invoke(app, ["delete", "tiny", "--yes", "--storage", sqlite_url])
    assert deleted.exit_code == 0, deleted.output
    assert status_of(sqlite_url, "tiny") is None and not artifact_store.holds_files(elsewhere)
