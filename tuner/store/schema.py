"""The project's own tables, beside Optuna's in the same database, and how to connect.

Optuna owns trials, their parameters, states and values; these tables add what Optuna does not
keep: the submitted spec and study lifecycle, per-turn learning curves, checkpoints and failure
reasons. Table names start with `lmt_` so they never collide with Optuna's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

STUDY_STATUSES = ("queued", "running", "cancelling", "cancelled", "complete", "failed")


BEYOND_TUNING = text("(stage <> 'tune' OR interrupted)")  # later stages' trials, interrupted tuning trials


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC timestamp on every backend (SQLite drops the offset of DateTime(timezone=True))."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime}


class StudyRecord(Base):
    __tablename__ = "lmt_studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    families: Mapped[str] = mapped_column(String(256))  # ",lstm,mogrifier,": filterable with LIKE everywhere
    document: Mapped[str] = mapped_column(Text)
    submitted_via: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    controller: Mapped[str | None] = mapped_column(String(128))  # host:pid of the process running it
    best_possible_loss: Mapped[float | None] = mapped_column(Float)  # known for generated corpora
    unigram_perplexity: Mapped[float | None] = mapped_column(Float)  # of its validation split, once its corpus is read
    corpus_digest: Mapped[str | None] = mapped_column(String(64))  # of its tokens (corpus_digest), once first run
    error: Mapped[str | None] = mapped_column(Text)
    artifact_root: Mapped[str | None] = mapped_column(Text)  # where its checkpoints are stored
    warnings: Mapped[list[str] | None] = mapped_column(JSON)  # what its run warned about, e.g. evaluation's share
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # a compute-budgeted study's rungs, fixed at its start


class TrialCountRecord(Base):
    """A study's tuning trials (stage "tune") per state, kept by triggers on lmt_trials (migration 0002):
    never written by the application (deleting a study deletes its row)."""

    __tablename__ = "lmt_trial_counts"

    study_name: Mapped[str] = mapped_column(String(64), primary_key=True)
    tuning_complete: Mapped[int] = mapped_column(server_default="0")
    tuning_running: Mapped[int] = mapped_column(server_default="0")
    tuning_pruned: Mapped[int] = mapped_column(server_default="0")
    tuning_fail: Mapped[int] = mapped_column(server_default="0")
    tuning_waiting: Mapped[int] = mapped_column(server_default="0")


class TrialRecord(Base):
    """What a trial is beyond Optuna's record; keyed by Optuna's global trial id.

    `state` and `value` copy Optuna's (see tuner.ledger) so that pages and rankings need one table.
    """

    __tablename__ = "lmt_trials"
    __table_args__ = (Index("ix_lmt_trials_study_state", "study_name", "state"),
                      Index("ix_lmt_trials_study_value", "study_name", "value"),
                      # the rows progress reads beyond the tuning counters (tuner.results), a few per study
                      Index("ix_lmt_trials_beyond_tuning", "study_name", postgresql_where=BEYOND_TUNING,
                            sqlite_where=BEYOND_TUNING))

    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    study_name: Mapped[str] = mapped_column(String(64), index=True)
    family: Mapped[str] = mapped_column(String(32))
    stage: Mapped[str] = mapped_column(String(16), default="tune")  # tune, rerun, dyneval or sensitivity
    parent_trial_id: Mapped[int | None] = mapped_column(Integer)  # the trial a rerun repeats / a dyneval adapts
    state: Mapped[str] = mapped_column(String(16), default="RUNNING")
    value: Mapped[float | None] = mapped_column(Float)  # best validation loss, COMPLETE trials only
    number: Mapped[int] = mapped_column(Integer)
    hidden_size: Mapped[int | None] = mapped_column(Integer)  # None: no model fits the budget
    parameter_count: Mapped[int | None] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer)
    fail_reason: Mapped[str | None] = mapped_column(Text)
    interrupted: Mapped[bool] = mapped_column(default=False)  # failed because its controller stopped
    turns_reported: Mapped[int] = mapped_column(Integer, default=0)
    wall_seconds: Mapped[float | None] = mapped_column(Float)  # training time up to the last report
    train_seconds: Mapped[float | None] = mapped_column(Float)  # of which optimisation steps, over its turns
    eval_seconds: Mapped[float | None] = mapped_column(Float)  # and validation evaluations
    val_tokens: Mapped[int | None] = mapped_column(Integer)  # validation tokens its losses are means over
    val_subset: Mapped[bool | None] = mapped_column()  # those are the split's first tokens only, not all of it
    full_value: Mapped[float | None] = mapped_column(Float)  # best checkpoint on the whole split (if val_subset)
    reversed_loss: Mapped[float | None] = mapped_column(Float)  # reverse-copy tasks: of its best turn, see TurnRecord
    reversed_accuracy: Mapped[float | None] = mapped_column(Float)
    tokens: Mapped[int | None] = mapped_column(BigInteger)  # training tokens up to its last report
    compute_seconds: Mapped[float | None] = mapped_column(Float)  # CPU core- or GPU-seconds up to its last report


class TurnRecord(Base):
    __tablename__ = "lmt_turns"
    __table_args__ = (UniqueConstraint("trial_id", "turn"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(Integer, index=True)
    turn: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    train_loss: Mapped[float] = mapped_column(Float)
    val_loss: Mapped[float] = mapped_column(Float)
    best_val_loss: Mapped[float] = mapped_column(Float)
    tokens_per_second: Mapped[float] = mapped_column(Float)
    wall_seconds: Mapped[float] = mapped_column(Float)
    process_seconds: Mapped[float | None] = mapped_column(Float)  # CPU time of the training process
    averaging_length: Mapped[int | None] = mapped_column(Integer)  # iterates averaged (1: raw weights)
    learning_rate: Mapped[float | None] = mapped_column(Float)  # lowered by divergence recovery
    epochs: Mapped[float | None] = mapped_column(Float)
    train_seconds: Mapped[float | None] = mapped_column(Float)  # this turn's optimisation steps
    eval_seconds: Mapped[float | None] = mapped_column(Float)  # this turn's validation evaluation
    val_tokens: Mapped[int | None] = mapped_column(Integer)  # validation tokens val_loss is the mean over
    val_subset: Mapped[bool | None] = mapped_column()  # val_loss covers the split's first tokens only
    reversed_loss: Mapped[float | None] = mapped_column(Float)  # reverse-copy tasks: loss on the reversed halves
    reversed_accuracy: Mapped[float | None] = mapped_column(Float)  # and the share of them predicted (argmax)
    val_logit_scale: Mapped[float | None] = mapped_column(Float)  # val_loss was scored with logits times this
    checkpoint_seconds: Mapped[float | None] = mapped_column(Float)  # this turn's checkpoint writes
    setup_seconds: Mapped[float | None] = mapped_column(Float)  # first turn of a process: model, state, kernels
    fine_tuning: Mapped[bool | None] = mapped_column()  # a turn of the fine-tuning stage (training.fine_tuning)
    tokens: Mapped[int | None] = mapped_column(BigInteger)  # training tokens of the trial so far
    compute_seconds: Mapped[float | None] = mapped_column(Float)  # CPU core- or GPU-seconds of the trial so far
    reported_at: Mapped[datetime | None] = mapped_column(default=utcnow)  # when the controller recorded it


class CheckpointRecord(Base):
    """The best checkpoint of a trial; `path` is relative to the artifact store."""

    __tablename__ = "lmt_checkpoints"

    trial_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    path: Mapped[str] = mapped_column(String(512))
    size_bytes: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    val_loss: Mapped[float] = mapped_column(Float)
    turn: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class EvaluationRecord(Base):
    """A final evaluation of a trial's best checkpoint: the test protocol, or dynamic evaluation."""

    __tablename__ = "lmt_evaluations"
    __table_args__ = (UniqueConstraint("trial_id", "kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(Integer, index=True)
    kind: Mapped[str] = mapped_column(String(16))  # deterministic, mc, dynamic, dynamic_mc
    valid_loss: Mapped[float] = mapped_column(Float)
    test_loss: Mapped[float] = mapped_column(Float)
    logit_scale: Mapped[float] = mapped_column(Float)
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)  # e.g. MC samples, the dynamic evaluation config
    dyneval_trial_id: Mapped[int | None] = mapped_column(Integer)  # the stage-2 trial whose config was used
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A bearer token for the REST API; only its SHA-256 is stored."""

    __tablename__ = "lmt_api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column()


class SettingRecord(Base):
    """A setting of the service that every process reads from the database, e.g. `auth` = `on`."""

    __tablename__ = "lmt_settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


def families_column(families: list[str]) -> str:
    return "," + ",".join(families) + ","
