"""A study runs on one corpus: the digest of its tokens is recorded when it first runs (and shown), a launch, resume
or worker that reads other tokens is refused, and a trial or evaluation that reads other tokens than its controller
(a Ray node with other files at the path) fails with the reason instead of training or scoring. None of these tests
starts Ray."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from lm_tuner.trainers import load_corpus
from lm_tuner.trainers.datasets import TextDatasetConfig
from lm_tuner.tuner.cli.app import app
from lm_tuner.tuner.run import controller, evaluation_jobs, trial
from lm_tuner.tuner.run.controller import StudyConflict, launch_study, run_claimed_study
from lm_tuner.tuner.run.reporting import FAILED
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import StudyRecord
from tests.conftest import serve_app
from tests.test_cli import tuner

WORDS = [f"w{i}" for i in range(12)]


def write_corpus(folder: Path, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    draw = random.Random(seed)
    for split, lines in (("train", 200), ("valid", 30), ("test", 30)):
        text = "\n".join(" ".join(draw.choices(WORDS, k=8)) for _ in range(lines)) + "\n"
        (folder / f"{split}.txt").write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def no_trials(monkeypatch) -> None:
    """Ray and the tuning stage replaced: a launch runs up to its first trial and stops there."""
    monkeypatch.setattr(controller, "connect_ray", lambda settings: None)
    monkeypatch.setattr(controller, "tune_families", lambda *args: None)


def _recorded_digest(url: str) -> str | None:
    with sessions(url)() as session:
        return session.scalar(select(StudyRecord.corpus_digest).where(StudyRecord.name == "tiny"))


def test_the_digest_changes_with_the_tokens_and_only_with_them(tmp_path):
    folder = write_corpus(tmp_path / "data")
    config = TextDatasetConfig(path=str(folder), format="text")
    first = load_corpus(config)
    assert load_corpus(config) is first  # files as they were: this process's cache
    train = folder / "train.txt"
    train.write_bytes(b"\xef\xbb\xbf" + train.read_bytes())  # a byte-order mark: other bytes, the same tokens
    marked = load_corpus(config)
    assert marked is not first and marked.digest == first.digest
    train.write_text(train.read_text(encoding="utf-8-sig").replace("w1 ", "w2 ", 1), encoding="utf-8")
    assert load_corpus(config).digest != first.digest  # the cache follows the files: a long-lived API or worker
    assert load_corpus(TextDatasetConfig(path=str(folder), format="text", level="char")).digest != first.digest


def test_a_launch_on_changed_files_is_refused_before_it_claims_the_study(no_trials, sqlite_url, tiny_spec, tmp_path):
    folder = write_corpus(tmp_path / "data")
    document = tiny_spec(dataset={"path": str(folder), "format": "text"})
    settings = Settings(sqlite_url, tmp_path / "artifacts")
    launch_study(parse_spec(document), document, settings)
    recorded = _recorded_digest(sqlite_url)
    assert recorded == load_corpus(parse_spec(document).dataset).digest

    write_corpus(folder, seed=1)
    with pytest.raises(StudyConflict, match=r"is not the data study 'tiny' ran on \(token digest .*recorded "
                                            rf"{recorded[:12]}\).*Restore them"):
        launch_study(parse_spec(document), document, settings)
    with sessions(sqlite_url)() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny"))
        assert record.controller is None and record.corpus_digest == recorded  # not claimed, nothing rewritten

    write_corpus(folder, seed=0)  # restored: the study continues
    launch_study(parse_spec(document), document, settings)
    assert _recorded_digest(sqlite_url) == recorded


def test_status_the_api_and_the_dashboard_show_the_recorded_digest(no_trials, sqlite_url, tiny_spec, tmp_path):
    folder = write_corpus(tmp_path / "data")
    document = tiny_spec(dataset={"path": str(folder), "format": "text"})
    launch_study(parse_spec(document), document, Settings(sqlite_url, tmp_path / "artifacts"))
    digest = load_corpus(parse_spec(document).dataset).digest

    shown = CliRunner().invoke(app, ["status", "tiny", "--storage", sqlite_url], env={"COLUMNS": "200"})
    assert f"tokens: sha256 {digest}" in shown.output, shown.output
    as_json = CliRunner().invoke(app, ["status", "tiny", "--json", "--storage", sqlite_url])
    assert json.loads(as_json.output)["corpus_digest"] == digest
    with serve_app(Settings(sqlite_url, tmp_path / "artifacts")) as base:
        assert httpx.get(f"{base}/studies/tiny").json()["corpus_digest"] == digest
        assert f'<b id="tokens" title="{digest}">{digest[:12]}…</b>' in httpx.get(f"{base}/dashboard/studies/tiny").text


def test_resume_on_changed_files_refuses_alone_before_its_header(no_trials, sqlite_url, tiny_spec, tmp_path):
    folder = write_corpus(tmp_path / "data")
    document = tiny_spec(dataset={"path": str(folder), "format": "text"})
    launch_study(parse_spec(document), document, Settings(sqlite_url, tmp_path / "artifacts"))
    write_corpus(folder, seed=1)

    resumed = tuner("resume", "tiny", "--storage", sqlite_url, "--artifacts", str(tmp_path / "artifacts"),
                    cwd=tmp_path)

    assert resumed.returncode == 2, resumed.stderr
    assert "error: dataset: text files (word level) in " in resumed.stderr
    assert "is not the data study 'tiny' ran on" in resumed.stderr and resumed.stdout == ""


def test_a_worker_reading_other_files_fails_the_study_with_the_reason(no_trials, sqlite_url, tiny_spec, tmp_path):
    folder = write_corpus(tmp_path / "data")
    document = tiny_spec(dataset={"path": str(folder), "format": "text"})
    settings = Settings(sqlite_url, tmp_path / "artifacts")
    launch_study(parse_spec(document), document, settings)
    write_corpus(folder, seed=1)  # the worker's machine holds other files at the same path

    with pytest.raises(StudyConflict, match="is not the data study 'tiny' ran on"):
        run_claimed_study(parse_spec(document), settings)
    with sessions(sqlite_url)() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny"))
        assert record.status == "failed" and "is not the data study 'tiny' ran on" in record.error


def test_a_trial_reading_other_tokens_than_its_controller_fails_without_training(monkeypatch, tiny_spec, tmp_path,
                                                                               one_torch_thread):
    folder = write_corpus(tmp_path / "data")
    spec = parse_spec(tiny_spec(dataset={"path": str(folder), "format": "text"}))
    job = trial.training_job(spec, str(tmp_path / "artifacts"))
    write_corpus(folder, seed=1)  # what a Ray node with other files at the path reads
    reports: list[dict] = []
    monkeypatch.setattr(trial.tune, "report", reports.append)
    monkeypatch.setattr(trial, "_train", lambda *args: pytest.fail("trained on other data"))

    trial.run_trial({"family": "lstm", "number": 0, "params": {"learning_rate": 0.003}, "seed": 0}, job)

    assert len(reports) == 1 and reports[0][FAILED].startswith("OtherCorpus: dataset: text files (word level) in ")
    assert "is not the data the study's controller read" in reports[0][FAILED]


@pytest.fixture
def moved_corpus(tiny_spec, tmp_path, one_torch_thread) -> tuple[dict, str, str]:
    """A study's spec, its controller's corpus digest and a checkpoint path, after the files at its dataset's path
    changed: what a Ray node with other files there reads."""
    folder = write_corpus(tmp_path / "data")
    spec = parse_spec(tiny_spec(dataset={"path": str(folder), "format": "text"}))
    digest = trial.corpus_digest(spec)
    write_corpus(folder, seed=1)
    return spec.model_dump(mode="json"), digest, str(tmp_path / "absent.pt")


@pytest.mark.parametrize("task", [
    lambda data, digest, checkpoint: evaluation_jobs.run_test_protocol(data, digest, checkpoint, 1),
    lambda data, digest, checkpoint: evaluation_jobs.run_full_validation(data, digest, checkpoint, 1),
    lambda data, digest, checkpoint: evaluation_jobs.run_dynamic_test(data, digest, checkpoint, {}, 1.0, None, 1),
], ids=["test protocol", "full validation", "dynamic test"])
def test_an_evaluation_task_on_other_tokens_than_its_controllers_is_refused(moved_corpus, task):
    with pytest.raises(trial.OtherCorpus, match="is not the data the study's controller read"):
        task(*moved_corpus)  # before the checkpoint is read: there is none


def test_a_stage_two_trial_on_other_tokens_than_its_controllers_fails_with_the_reason(moved_corpus, monkeypatch):
    data, digest, checkpoint = moved_corpus
    monkeypatch.setattr(evaluation_jobs, "_adaptable", lambda *args: (None, []))  # no checkpoint to adapt
    monkeypatch.setattr(evaluation_jobs, "dynamic_cross_entropy", lambda *args, **kwargs: pytest.fail("scored"))
    reports: list[dict] = []
    monkeypatch.setattr(evaluation_jobs.tune, "report", reports.append)

    evaluation_jobs.run_dynamic_evaluation_trial({"params": {}}, {"spec": data, "corpus_digest": digest,
                                                                  "checkpoint": checkpoint, "logit_scale": 1.0})

    assert len(reports) == 1 and reports[0][FAILED].startswith("OtherCorpus: dataset: text files (word level) in ")
