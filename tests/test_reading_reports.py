"""`tuner best` says which validation set its value is on and where the checkpoint file is; `tuner compare` of a
reverse-copy study shows the reversed half, the part that measures memory. Trial rows are written directly (no
Ray, no training), as tests/test_reports.py does."""

from __future__ import annotations

import json
import math

from lm_tuner.tuner.analysis.comparison import comparison
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import CheckpointRecord, TrialRecord
from tests.test_progress import add_study
from tests.test_reports import SUBSET, TWO_FAMILIES, command, rescore, row, set_status, trial


def trained(url: str, trial_id: int, *, val_subset: bool) -> None:
    """What a finished trial records beside its value: its size and which validation set it scored."""
    with sessions(url).begin() as session:
        record = session.get(TrialRecord, trial_id)
        record.parameter_count, record.hidden_size, record.val_subset = 8000, 16, val_subset


def with_checkpoint(url: str, trial_id: int, path: str) -> None:
    with sessions(url).begin() as session:
        session.add(CheckpointRecord(trial_id=trial_id, path=path, size_bytes=10, sha256="0" * 64, val_loss=2.0,
                                     turn=1))


def test_best_labels_the_subset_score_adds_the_full_one_and_gives_the_checkpoint_path(storage_url, tmp_path):
    add_study(storage_url, "subset-best", status="complete", **TWO_FAMILIES, training=SUBSET)
    lstm = trial(storage_url, "subset-best", "lstm", "COMPLETE", 2.0)
    rescore(storage_url, lstm, 2.2)
    mogrifier = trial(storage_url, "subset-best", "mogrifier", "COMPLETE", 2.1)  # not rescored (yet)
    for trial_id in (lstm, mogrifier):
        trained(storage_url, trial_id, val_subset=True)
    with_checkpoint(storage_url, lstm, "subset-best/lstm/trial-00000/best.pt")

    text = " ".join(command(storage_url, "best", "subset-best", "--artifacts", str(tmp_path)).split())
    assert f"lstm #0: val ppl (subset of 2,000 tokens) {math.exp(2.0):.3f}" in text
    assert f"full set {math.exp(2.2):.3f}" in text
    assert "mogrifier #0: val ppl (subset of 2,000 tokens)" in text and "full set: not scored yet" in text

    found = json.loads(command(storage_url, "best", "subset-best", "--artifacts", str(tmp_path), "--json"))
    assert found["lstm"]["validation"] == "subset of 2,000 tokens" and found["lstm"]["full_value"] == 2.2
    assert found["lstm"]["checkpoint"]["path"] == str(tmp_path / "subset-best/lstm/trial-00000/best.pt")
    assert found["lstm"]["checkpoint"]["url"].endswith("/checkpoint")
    assert found["mogrifier"]["checkpoint"] is None


def test_best_of_a_study_tuned_on_the_full_set_says_so(storage_url):
    add_study(storage_url, "full-best", status="complete")
    trained(storage_url, trial(storage_url, "full-best", "lstm", "COMPLETE", 2.0), val_subset=False)
    text = " ".join(command(storage_url, "best", "full-best").split())
    assert f"lstm #0: val ppl (full) {math.exp(2.0):.3f}" in text and "full set" not in text


REVERSE_COPY = {"dataset": {"generator": "reverse-copy", "symbols": 8, "length": 4, "train_examples": 200,
                            "valid_examples": 20, "test_examples": 20},
                "training": {"turns": 1, "steps_per_turn": 2, "batch_size": 4, "bptt": 12, "eval_batch_size": 2}}


def test_compare_of_a_reverse_copy_study_shows_the_reversed_half(storage_url):
    add_study(storage_url, "memory", **REVERSE_COPY, **TWO_FAMILIES, tuning={"trials": 1, "concurrency": 2})
    for family, loss, accuracy in (("lstm", 1.5, 0.25), ("mogrifier", 0.5, 0.75)):
        trial_id = trial(storage_url, "memory", family, "COMPLETE", 2.0)
        with sessions(storage_url).begin() as session:
            record = session.get(TrialRecord, trial_id)
            record.reversed_loss, record.reversed_accuracy = loss, accuracy
    set_status(storage_url, "memory", "complete")

    found = comparison(storage_url, "memory")
    assert [(f.reversed_loss.mean, f.reversed_accuracy.mean) for f in found.families] == [(1.5, 0.25), (0.5, 0.75)]
    text = command(storage_url, "compare", "memory")
    assert "reversed half: loss" in text and "accuracy" in text
    assert row(text, "mogrifier")[-2:] == ["0.500 (n=1)", "75.0% (n=1)"]
    payload = json.loads(command(storage_url, "compare", "memory", "--json"))
    assert payload["families"][0]["reversed_accuracy"]["mean"] == 0.25


def test_compare_of_a_text_study_has_no_reversed_half_columns(storage_url):
    add_study(storage_url, "words", status="complete", **TWO_FAMILIES, tuning={"trials": 1, "concurrency": 2})
    for family in ("lstm", "mogrifier"):
        trial(storage_url, "words", family, "COMPLETE", 2.0)
    assert "reversed half" not in command(storage_url, "compare", "words")
