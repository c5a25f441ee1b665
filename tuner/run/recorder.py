"""A Ray Tune callback, in the controller process, that writes what trials report to the database.

Optuna's tables get states and values from the searcher; this adds the learning curve (one row per
turn), the best checkpoint of each trial, what its evaluations cost and covered, and the reason a
trial failed. It also warns, once per study, when evaluating takes a large share of a trial's time (and more than
MIN_WARNED_EVALUATION_SECONDS: a share of a trial too short to matter is not): the warning is
stored with the study (`tuner status`, `GET /studies/{name}`, and the launch's progress lines, which read it
right after this callback) and logged (a worker's log).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

from ray.tune import Callback
from sqlalchemy import delete, func, select

from lm_tuner.tuner.run.reporting import FAILED
from lm_tuner.tuner.spec.estimate import MIN_WARNED_EVALUATION_SECONDS
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import CheckpointRecord, StudyRecord, TrialRecord, TurnRecord

TURN_FIELDS = ("turn", "step", "train_loss", "val_loss", "best_val_loss", "tokens_per_second", "wall_seconds",
               "process_seconds", "averaging_length", "learning_rate", "epochs", "train_seconds", "eval_seconds",
               "val_tokens", "val_subset", "reversed_loss", "reversed_accuracy", "val_logit_scale",
               "checkpoint_seconds", "setup_seconds", "fine_tuning", "tokens", "compute_seconds")

EVALUATION_SHARE_LIMIT = 0.25
"""Beyond this share of a trial's time spent evaluating, the study is warned about (once)."""

EVALUATION_WARNING = "evaluation took"
"""In the evaluation-share warning's text: a study that has it stored is not warned again (a resumed study)."""

SHOWN_BY_PROGRESS = "shown_by_progress"
"""On the log record of a warning that is also stored: a launch's progress lines show it, its log need not."""

log = logging.getLogger("lm_tuner")


class StudyRecorder(Callback):
    _warned_studies: ClassVar[set[str]] = set()  # in this controller process, over all of a study's experiments

    def __init__(self, storage_url: str) -> None:
        self._url = storage_url  # Ray pickles callbacks: keep a URL, not an engine

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if FAILED in result or "train_loss" not in result:
            return  # a failure (the searcher records it) or a stage-2 result, which has no learning curve
        trial_id = trial.config["optuna_trial_id"]
        with sessions(self._url).begin() as session:
            held = session.scalar(select(TurnRecord).where(TurnRecord.trial_id == trial_id,
                                                           TurnRecord.turn == result["turn"]))
            if held is not None and (held.step, held.wall_seconds) == (result["step"], result["wall_seconds"]):
                return  # a resumed trial telling a restored turn again (train's report_restored): recorded already
            # A trial retried from a checkpoint trains some turns again: the latest report wins.
            session.execute(delete(TurnRecord).where(TurnRecord.trial_id == trial_id,
                                                     TurnRecord.turn == result["turn"]))
            session.add(TurnRecord(trial_id=trial_id, **{name: result.get(name) for name in TURN_FIELDS}))
            session.flush()
            record = session.get(TrialRecord, trial_id)
            if record is not None:
                record.turns_reported, record.wall_seconds = result["turn"], result["wall_seconds"]
                record.tokens, record.compute_seconds = result.get("tokens"), result.get("compute_seconds")
                record.val_tokens, record.val_subset = result["val_tokens"], result["val_subset"]
                if result.get("improved"):
                    record.reversed_loss = result.get("reversed_loss")
                    record.reversed_accuracy = result.get("reversed_accuracy")
                record.train_seconds, record.eval_seconds = session.execute(
                    select(func.sum(TurnRecord.train_seconds), func.sum(TurnRecord.eval_seconds))
                    .where(TurnRecord.trial_id == trial_id)).one()
            if "checkpoint_path" in result:
                session.merge(CheckpointRecord(
                    trial_id=trial_id,
                    path=result["checkpoint_path"],
                    size_bytes=result["checkpoint_bytes"],
                    sha256=result["checkpoint_sha256"],
                    val_loss=result["val_loss"],
                    turn=result["turn"],
                ))
        if record is not None:
            self._warn_if_evaluation_dominates(record, subset=result["val_subset"])

    def _warn_if_evaluation_dominates(self, record: TrialRecord, *, subset: bool) -> None:
        evaluating, training = record.eval_seconds or 0.0, record.train_seconds or 0.0
        if record.study_name in self._warned_studies or evaluating + training <= 0:
            return
        share = evaluating / (evaluating + training)
        if share <= EVALUATION_SHARE_LIMIT or evaluating < MIN_WARNED_EVALUATION_SECONDS:
            return
        self._warned_studies.add(record.study_name)
        fix = ("lower training.validation_tokens" if subset else
               "set training.validation_tokens to score a fixed subset of the validation split after each turn")
        stage = "" if record.stage == "tune" else f"{record.stage} "
        message = (f"study {record.study_name!r}, family {record.family!r}: {EVALUATION_WARNING} {share:.0%} of "
                   f"{stage}trial {record.number}'s time so far ({evaluating:.1f} s of {evaluating + training:.1f} s), "
                   f"more than {EVALUATION_SHARE_LIMIT:.0%}; {fix}, or raise training.steps_per_turn")
        if self._stored(record.study_name, message):
            log.warning("%s", message, extra={SHOWN_BY_PROGRESS: True})

    def _stored(self, study_name: str, message: str) -> bool:
        """Adds the warning to the study's; False if the study has one already (an earlier run of it warned)."""
        with sessions(self._url).begin() as session:
            study = session.scalar(select(StudyRecord).where(StudyRecord.name == study_name).with_for_update())
            if study is None:
                return True  # no study row to keep it on: the log still tells
            if any(EVALUATION_WARNING in warning for warning in study.warnings or []):
                return False
            study.warnings = [*(study.warnings or []), message]  # a new list: JSON columns track assignment
        return True

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        with sessions(self._url).begin() as session:
            record = session.get(TrialRecord, trial.config["optuna_trial_id"])
            if record is not None:
                record.fail_reason = failure_reason(trial) or record.fail_reason or "failed without an error message"


def failure_reason(trial: Any) -> str | None:
    """The last line of the trial's traceback, e.g. 'TrainingDiverged: training diverged at ...'."""
    # Ray writes the error to the trial's local staging folder at once; get_error() reads the
    # synced copy, which may not exist yet when this callback runs.
    path = Path(trial.error_file) if trial.error_file else None
    text = path.read_text() if path is not None and path.is_file() else ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None
