"""What a study's run warned about (evaluation taking most of each trial) is stored with the study: the launch's
progress lines print it as soon as it is recorded, and `tuner status`, `GET /studies/{name}` and the dashboard show
it whoever ran the study. The study detail, the comparison and the dashboard carry the corpus's unigram baseline,
as `tuner status` and `tuner compare` do: the one stored with the study once its corpus was read, without reading the
corpus again."""

from __future__ import annotations

import io
import json
import logging
import math

import httpx
import pytest
from rich.console import Console
from sqlalchemy import select

from lm_tuner.trainers import load_corpus, unigram_perplexity
from lm_tuner.trainers.datasets import dataset_from_dict
from lm_tuner.tuner.analysis.comparison import Comparison, FamilyResult
from lm_tuner.tuner.analysis.study_facts import Baseline, baseline_warning
from lm_tuner.tuner.cli.live_board import Board
from lm_tuner.tuner.cli.live_display import ProgressDisplay
from lm_tuner.tuner.cli.progress import ProgressPrinter, live_progress
from lm_tuner.tuner.cli.status_report import print_study
from lm_tuner.tuner.run.recorder import StudyRecorder
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import StudyRecord
from lm_tuner.tuner.store.studies import get_study
from tests.conftest import serve_app
from tests.test_evaluation_subset import turn_result
from tests.test_progress import ONE_FAMILY, add_study, add_trial, ray_trial
from tests.test_reports import TWO_FAMILIES, command, trial

EVALUATION_HEAVY = {"train_seconds": 2.0, "eval_seconds": 6.0}  # 75% of the turn evaluating, over 5 s


@pytest.fixture(autouse=True)
def fresh_recorder(monkeypatch):
    monkeypatch.setattr(StudyRecorder, "_warned_studies", set())  # as in a new controller process


def record_turn(url: str, trial_id: int, turn: int, **seconds: float) -> None:
    StudyRecorder(url).on_trial_result(0, [], ray_trial(trial_id, 0), turn_result(turn, **seconds))


def ours(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "lm_tuner"]


def test_the_launch_prints_the_evaluation_warning_with_the_result_that_raised_it(storage_url):
    add_study(storage_url, "costly")
    output = io.StringIO()
    display = ProgressDisplay(Board(get_study(storage_url, "costly").spec, lambda: 0.0),
                              Console(file=output, width=400, highlight=False), lambda: 0.0)
    printer = ProgressPrinter(storage_url, "costly", display)
    trial_id = add_trial(storage_url, "costly", "tune", "RUNNING", seconds=0)
    printer.on_trial_start(0, [], ray_trial(trial_id, 0))
    for turn in (1, 2):  # the recorder runs first in the callbacks Ray is given, then the printer
        record_turn(storage_url, trial_id, turn, **EVALUATION_HEAVY)
        printer.on_trial_result(0, [], ray_trial(trial_id, 0), turn_result(turn, **EVALUATION_HEAVY))
    lines = output.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("start  costly/lstm#0")
    assert lines[1] == ("warning: study 'costly', family 'lstm': evaluation took 75% of trial 0's time so far "
                        "(6.0 s of 8.0 s), more than 25%; set training.validation_tokens to score a fixed subset of "
                        "the validation split after each turn, or raise training.steps_per_turn")
    assert get_study(storage_url, "costly").warnings == [lines[1].removeprefix("warning: ")]


def test_a_launch_shows_the_warning_once_and_a_worker_logs_it(storage_url, caplog):
    add_study(storage_url, "logged")
    trial_id = add_trial(storage_url, "logged", "tune", "RUNNING", seconds=0)
    spec = StudySpec.model_validate(get_study(storage_url, "logged").spec)
    with caplog.at_level(logging.WARNING, logger="lm_tuner"):
        with live_progress(storage_url, spec, Console(file=io.StringIO())):
            record_turn(storage_url, trial_id, 1, **EVALUATION_HEAVY)
        assert not ours(caplog)  # the progress lines print it: not a second time through the log
        add_study(storage_url, "worked")  # no launch printer: a worker's log is where it shows
        record_turn(storage_url, add_trial(storage_url, "worked", "tune", "RUNNING", seconds=0), 1,
                    **EVALUATION_HEAVY)
    (logged,) = ours(caplog)
    assert "study 'worked', family 'lstm': evaluation took 75%" in logged.getMessage()


def test_the_share_of_a_trial_too_short_to_matter_is_not_warned_about(sqlite_url):
    """small/mogrifier_ptb was told evaluation took 44% of trial 1's time (0.0 s of 0.1 s): evaluating costs less
    than starting a trial there, and the share of a tenth of a second is noise."""
    add_study(sqlite_url, "quick")
    trial_id = add_trial(sqlite_url, "quick", "tune", "RUNNING", seconds=0)
    record_turn(sqlite_url, trial_id, 1, train_seconds=0.05, eval_seconds=0.04)
    record_turn(sqlite_url, trial_id, 2, train_seconds=1.0, eval_seconds=4.9)  # 4.94 s of 6.0 s so far
    assert get_study(sqlite_url, "quick").warnings == []
    record_turn(sqlite_url, trial_id, 3, train_seconds=0.1, eval_seconds=0.1)  # 5.04 s: now it costs a trial's start
    (warning,) = get_study(sqlite_url, "quick").warnings
    assert "evaluation took 81% of trial 0's time so far (5.0 s of 6.2 s)" in warning


def test_a_resumed_study_is_not_warned_twice(storage_url):
    add_study(storage_url, "resumed")
    trial_id = add_trial(storage_url, "resumed", "tune", "RUNNING", seconds=0)
    record_turn(storage_url, trial_id, 1, **EVALUATION_HEAVY)
    StudyRecorder._warned_studies.clear()  # a new controller process continues the study
    record_turn(storage_url, add_trial(storage_url, "resumed", "rerun", "RUNNING", seconds=0), 1,
                **EVALUATION_HEAVY)
    (warning,) = get_study(storage_url, "resumed").warnings
    assert "trial 0's time" in warning and "rerun trial" not in warning


def test_status_the_api_and_the_dashboard_show_the_warnings_and_the_unigram_baseline(sqlite_url, tmp_path, capsys):
    add_study(sqlite_url, "shown")
    record_turn(sqlite_url, add_trial(sqlite_url, "shown", "tune", "COMPLETE"), 1, **EVALUATION_HEAVY)
    (warning,) = get_study(sqlite_url, "shown").warnings
    unigram = float(unigram_perplexity(load_corpus(dataset_from_dict(ONE_FAMILY["dataset"]))))
    settings = Settings(sqlite_url, tmp_path / "artifacts")

    assert print_study(settings, "shown")
    assert f"warning: {warning}" in " ".join(capsys.readouterr().out.split())
    assert print_study(settings, "shown", as_json=True)
    printed = json.loads(capsys.readouterr().out)
    assert printed["warnings"] == [warning]
    assert printed["unigram_baseline"] == {"perplexity": pytest.approx(unigram), "unknown_because": None}

    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
        detail = client.get("/studies/shown").json()
        assert detail["warnings"] == [warning]
        assert detail["unigram_baseline"] == printed["unigram_baseline"]
        compared = client.get("/studies/shown/comparison").json()
        assert compared["unigram_baseline"] == printed["unigram_baseline"]
        page = client.get("/dashboard/studies/shown").text
        assert f'<b id="unigram">{unigram:.3f}</b>' in page
        assert "word frequencies alone, on validation" in page
        assert f"warning: {warning}".replace("'", "&#39;") in page


def test_a_baseline_that_cannot_be_read_says_why(sqlite_url, tmp_path):
    add_study(sqlite_url, "elsewhere", dataset={"path": str(tmp_path / "gone"), "format": "ptb"})
    with serve_app(Settings(sqlite_url, tmp_path / "artifacts")) as base_url, \
            httpx.Client(base_url=base_url, timeout=60) as client:
        baseline = client.get("/studies/elsewhere").json()["unigram_baseline"]
        assert baseline["perplexity"] is None and "no folder at" in baseline["unknown_because"]
        assert client.get("/studies/elsewhere/comparison").json()["unigram_baseline"] == baseline
        page = client.get("/dashboard/studies/elsewhere").text
        assert f"unknown: {baseline['unknown_because'].partition(' (format')[0]}" in page


def test_a_stored_baseline_is_shown_without_reading_the_corpus(sqlite_url, tmp_path, capsys):
    """Reading the corpus for every report took seconds per study on a 100 MB corpus: once stored, the baseline
    is what `tuner status`, the API and the dashboard show, the corpus gone or not."""
    add_study(sqlite_url, "stored", dataset={"path": str(tmp_path / "gone"), "format": "ptb"})
    with sessions(sqlite_url).begin() as session:
        session.scalar(select(StudyRecord).where(StudyRecord.name == "stored")).unigram_perplexity = 123.25
    settings = Settings(sqlite_url, tmp_path / "artifacts")
    assert print_study(settings, "stored", as_json=True)
    stored = {"perplexity": 123.25, "unknown_because": None}
    assert json.loads(capsys.readouterr().out)["unigram_baseline"] == stored
    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
        assert client.get("/studies/stored").json()["unigram_baseline"] == stored
        assert client.get("/studies/stored/comparison").json()["unigram_baseline"] == stored
        assert '<b id="unigram">123.250</b>' in client.get("/dashboard/studies/stored").text


def test_a_submitted_study_stores_the_baseline_of_the_data_the_api_read(sqlite_url, tmp_path):
    settings = Settings(sqlite_url, tmp_path / "artifacts")
    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
        response = client.post("/studies", content=json.dumps({**ONE_FAMILY, "name": "submitted"}))
        assert response.status_code == 202, response.text
    expected = unigram_perplexity(load_corpus(dataset_from_dict(ONE_FAMILY["dataset"])))
    assert get_study(sqlite_url, "submitted").unigram_perplexity == pytest.approx(expected)


def test_families_that_do_not_beat_the_baseline_are_named_wherever_the_study_is_reported(sqlite_url, tmp_path,
                                                                                          capsys):
    """A family that predicts no better than word frequencies learned nothing its architecture is responsible for
    (too few steps, a learning rate range that misses): `tuner status`, `tuner compare`, the API's comparison and
    the dashboard's say so, whichever family wins."""
    add_study(sqlite_url, "flat", status="complete", **TWO_FAMILIES, tuning={"trials": 1, "concurrency": 1})
    with sessions(sqlite_url).begin() as session:
        session.scalar(select(StudyRecord).where(StudyRecord.name == "flat")).unigram_perplexity = 123.25
    trial(sqlite_url, "flat", "lstm", "COMPLETE", math.log(100.0))
    trial(sqlite_url, "flat", "mogrifier", "COMPLETE", math.log(123.25))  # equal to the baseline: not beating it
    expected = ("mogrifier does not beat the unigram baseline (word frequencies alone): too few training steps, or "
                "searched ranges without a working learning rate; such a score says nothing about the architecture")
    settings = Settings(sqlite_url, tmp_path / "artifacts")

    assert print_study(settings, "flat")
    assert f"warning: {expected}" in " ".join(capsys.readouterr().out.split())
    compared = command(sqlite_url, "compare", "flat")
    assert "winner: lstm" in compared and f"warning: {expected}" in " ".join(compared.split())
    assert json.loads(command(sqlite_url, "compare", "flat", "--json"))["no_better_than_baseline"] == ["mogrifier"]
    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
        assert client.get("/studies/flat/comparison").json()["no_better_than_baseline"] == ["mogrifier"]
        page = client.get("/dashboard/studies/flat/comparison").text
        assert f'id="baseline-warning">warning: {expected}</p>' in page
        assert "Unigram baseline (word frequencies alone): 123.250." in page


@pytest.mark.parametrize(("unit", "baseline", "scores", "behind"), [
    ("perplexity", Baseline(50.0), {"lstm": 49.9, "mogrifier": 50.0, "rlstm": None}, ["mogrifier"]),
    ("bpc", Baseline(2.0 ** 4.5), {"lstm": 4.49, "mogrifier": 4.51}, ["mogrifier"]),  # 4.5 bits per character
    ("perplexity", Baseline(None, "no folder at /gone"), {"lstm": 1e9}, []),  # unknown: nothing is claimed
])
def test_a_family_beats_the_baseline_only_below_it_in_its_unit(unit, baseline, scores, behind):
    found = Comparison(study="s", unit=unit, winner=None, winner_by="", families=[
        FamilyResult(family=family, complete_tuning_trials=1, best_tuning=score, final_trial_ids=[])
        for family, score in scores.items()])
    assert found.no_better_than(baseline) == behind
    assert baseline_warning([]) is None
