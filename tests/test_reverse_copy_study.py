"""Reverse-copy as a real task: a study on it records, per turn and per trial, the loss and accuracy on the reversed
halves (the part that measures memory) next to the all-token loss, and `tuner status` and the REST API show them."""

from __future__ import annotations

import pytest
import yaml
from sqlalchemy import select

from lm_tuner.api.schemas import TurnOut
from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.documents import TrialOut
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import TurnRecord
from lm_tuner.tuner.store.trials import get_trial, learning_curve
from tests.conftest import TINY_SPEC
from tests.test_reports import command, row

REVERSE_COPY = {**TINY_SPEC, "name": "memory", "families": ["lstm"],
                "dataset": {"generator": "reverse-copy", "symbols": 6, "length": 3, "train_examples": 300,
                            "valid_examples": 30, "test_examples": 30},
                "fixed": {"num_layers": 1},
                "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
                "tuning": {"sampler": "random", "trials": 1, "concurrency": 1}}


@pytest.mark.slow
def test_a_reverse_copy_study_reports_the_reversed_half(ray_cluster, sqlite_url, tmp_path) -> None:
    storage_url = sqlite_url  # the columns' migration is tested on both databases elsewhere
    document = yaml.safe_dump(REVERSE_COPY)
    spec, settings = parse_spec(document), Settings(storage_url, tmp_path / "artifacts")
    assert launch_study(spec, document, settings) == "complete"
    with sessions(storage_url)() as session:
        (trial_id,) = set(session.scalars(select(TurnRecord.trial_id)))
    turns = learning_curve(storage_url, trial_id)
    assert len(turns) == 3
    assert all(t.reversed_loss > 0 and 0 <= t.reversed_accuracy <= 1 and t.val_logit_scale > 0 for t in turns)
    best = min(turns, key=lambda t: t.val_loss)
    trial = TrialOut.of(get_trial(storage_url, trial_id))
    assert (trial.reversed_loss, trial.reversed_accuracy) == (best.reversed_loss, best.reversed_accuracy)
    assert TurnOut.of(best).reversed_accuracy == best.reversed_accuracy

    text = command(storage_url, "status", "memory")
    header = next(line for line in text.splitlines() if "reversed half: loss" in line)
    assert "accuracy" in header
    assert row(text, "1")[3:5] == [f"{best.reversed_loss:.3f}", f"{best.reversed_accuracy:.1%}"]
