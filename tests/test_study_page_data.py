"""What the study and trial pages are given, on SQLite and PostgreSQL, trial rows written directly (no training):
the default learning curves (running trials among them), the trial page's words on the test protocol as the study
has it, and importance computed without a line in the server's log."""

from __future__ import annotations

import html
import logging
import re

import httpx
import numpy as np
import optuna
import pytest
from sqlalchemy import update

from lm_tuner.tuner.analysis.study_frames import MAX_CURVES, default_curve_trial_ids, importances
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import TrialRecord
from tests.conftest import serve_app
from tests.test_progress import STAGED, add_study, add_trial


def test_default_learning_curves_are_the_best_five_then_the_running_trials(storage_url):
    add_study(storage_url, "curving", tuning={"trials": 20, "concurrency": 8})
    complete = [add_trial(storage_url, "curving", "tune", "COMPLETE", params={"learning_rate": 0.5})
                for _ in range(7)]
    running = [add_trial(storage_url, "curving", "tune", "RUNNING") for _ in range(9)]
    waiting = add_trial(storage_url, "curving", "tune", "RUNNING")  # started, no turn reported yet
    with sessions(storage_url).begin() as session:
        for rank, trial_id in enumerate(reversed(complete)):
            session.execute(update(TrialRecord).where(TrialRecord.trial_id == trial_id).values(value=4.0 + rank))
        session.execute(update(TrialRecord).where(TrialRecord.trial_id.in_(running)).values(turns_reported=9))
    chosen = default_curve_trial_ids(storage_url, "curving")
    assert chosen[:5] == list(reversed(complete))[:5]  # best first
    assert chosen[5:] == running[:MAX_CURVES - 5] and waiting not in chosen
    assert default_curve_trial_ids(storage_url, "nothing") == []


@pytest.mark.parametrize(("stages", "words"), [
    ({}, "This study has no test-protocol stage (no evaluation in its spec): none of its trials is scored on the "
         "test split."),
    ({"evaluation": {"bptt": 10}}, "Not evaluated with the test protocol: this study scores each family's best "
                                   "tuning trial once tuning is over."),
    (STAGED, "Not evaluated with the test protocol: this study scores the reruns of each family's best "
             "configurations and each family's best tuning trial once tuning is over."),
])
def test_the_trial_page_says_what_the_study_evaluates_with_the_test_protocol(storage_url, tmp_path, stages, words):
    add_study(storage_url, "staged", **stages)
    trial_id = add_trial(storage_url, "staged", "tune", "COMPLETE")
    with serve_app(Settings(storage_url, tmp_path / "artifacts")) as base_url:
        page = httpx.get(f"{base_url}/dashboard/trials/{trial_id}").text
    shown = " ".join(html.unescape(re.sub(r"<[^>]+>", "", page.split('id="no-evaluation">')[1].split("</p>")[0]))
                     .split())
    assert shown == words and "only final models are" not in page


def test_importance_leaves_no_line_in_the_log(storage_url):
    add_study(storage_url, "ranked", tuning={"trials": 8, "concurrency": 2})
    rng = np.random.default_rng(0)
    for _ in range(6):
        trial_id = add_trial(storage_url, "ranked", "tune", "COMPLETE",
                             params={"learning_rate": float(rng.uniform()), "dropout": float(rng.uniform())})
        with sessions(storage_url).begin() as session:
            session.get(TrialRecord, trial_id).value = float(rng.uniform(4.0, 5.0))
    logged = Recorded()
    optuna_logger, verbosity = logging.getLogger("optuna"), optuna.logging.get_verbosity()
    optuna_logger.addHandler(logged)
    optuna.logging.set_verbosity(optuna.logging.INFO)  # Optuna's default, which `tuner serve` keeps
    try:
        ranked = importances(storage_url, "ranked", "lstm", "ped_anova")
    finally:
        optuna_logger.removeHandler(logged)
        optuna.logging.set_verbosity(verbosity)
    assert set(ranked) == {"learning_rate", "dropout"}
    assert logged.messages == []  # not "A new study created in memory with name: no-name-..." per page view


class Recorded(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
