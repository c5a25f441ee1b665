"""The schema: created and migrated by Alembic, safely from several processes, matching the models."""

from __future__ import annotations

import subprocess
import sys

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from lm_tuner.tuner.store.engine import VERSION_TABLE, alembic_config, current_revision, engine_for, ensure_schema

PROJECT_TABLES = {"lmt_studies", "lmt_trials", "lmt_turns", "lmt_checkpoints", "lmt_api_tokens", VERSION_TABLE}


def test_schema_is_created_at_head_and_repeatable(storage_url):
    ensure_schema(storage_url)
    ensure_schema(storage_url)
    tables = set(inspect(engine_for(storage_url)).get_table_names())
    assert PROJECT_TABLES <= tables
    assert {"studies", "trials", "trial_values", "alembic_version"} <= tables  # Optuna's, untouched by ours
    head = ScriptDirectory.from_config(alembic_config(storage_url)).get_current_head()
    assert current_revision(storage_url) == head


def test_models_and_migrations_agree(storage_url):
    ensure_schema(storage_url)
    command.check(alembic_config(storage_url))  # raises if a model changed without a migration


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_two_processes_creating_the_schema_at_once(backend, request):
    url = request.getfixturevalue(f"{backend}_url")
    upgrade = [sys.executable, "-m", "lm_tuner.tuner", "db", "upgrade", "--storage", url]
    processes = [subprocess.Popen(upgrade, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        assert "schema at revision" in " ".join(out.split())
    assert PROJECT_TABLES <= set(inspect(engine_for(url)).get_table_names())


@pytest.mark.parametrize("status, after", [("running", "queued"), ("complete", "complete"), ("failed", "failed")])
def test_a_stopping_worker_requeues_only_a_study_still_running(storage_url, status, after):
    from sqlalchemy import select, update

    from lm_tuner.tuner.run.queue import requeue_study, submit_study
    from lm_tuner.tuner.spec import parse_spec
    from lm_tuner.tuner.store.engine import sessions
    from lm_tuner.tuner.store.schema import StudyRecord
    from tests.conftest import TINY_SPEC

    ensure_schema(storage_url)
    submit_study(storage_url, parse_spec(TINY_SPEC), "document")
    with sessions(storage_url).begin() as session:
        session.execute(update(StudyRecord).where(StudyRecord.name == TINY_SPEC["name"]).values(status=status))
    requeue_study(storage_url, TINY_SPEC["name"])
    with sessions(storage_url)() as session:
        assert session.scalar(select(StudyRecord.status).where(StudyRecord.name == TINY_SPEC["name"])) == after


def _trial(trial_id: int, study: str, state: str, stage: str = "tune"):
    from lm_tuner.tuner.store.schema import TrialRecord

    return TrialRecord(trial_id=trial_id, study_name=study, family="lstm", number=trial_id, seed=0, state=state,
                       stage=stage)


def _counters_match_the_trials(url: str) -> dict[str, dict[str, int]]:
    """Each study's tuning counters, asserted equal to its tuning trials counted afresh."""
    from sqlalchemy import func, select

    from lm_tuner.tuner.store.engine import sessions
    from lm_tuner.tuner.store.schema import TrialCountRecord, TrialRecord
    from lm_tuner.tuner.store.views import TRIAL_STATES

    with sessions(url)() as session:
        stored = {row.study_name: {state: getattr(row, f"tuning_{state.lower()}") for state in TRIAL_STATES}
                  for row in session.scalars(select(TrialCountRecord))}
        recounted = {name: dict.fromkeys(TRIAL_STATES, 0) for name in stored}
        for name, state, count in session.execute(
                select(TrialRecord.study_name, TrialRecord.state, func.count()).where(TrialRecord.stage == "tune")
                .group_by(TrialRecord.study_name, TrialRecord.state)):
            recounted.setdefault(name, dict.fromkeys(TRIAL_STATES, 0))[state] = count
    assert stored == recounted
    return stored


def test_tuning_trial_counters_follow_every_write(storage_url):
    """Inserts, state and stage changes, moves between studies, bulk updates and deletes: the triggers
    keep each study's counters equal to a fresh count (a study's row appears with its first trial)."""
    from sqlalchemy import delete, update

    from lm_tuner.tuner.store.engine import sessions
    from lm_tuner.tuner.store.schema import TrialRecord

    ensure_schema(storage_url)
    with sessions(storage_url).begin() as session:
        session.add_all([_trial(1, "a", "RUNNING"), _trial(2, "a", "RUNNING"), _trial(3, "a", "COMPLETE"),
                         _trial(4, "a", "COMPLETE", stage="rerun"), _trial(5, "b", "FAIL")])
    assert _counters_match_the_trials(storage_url)["a"] == {"COMPLETE": 1, "RUNNING": 2, "PRUNED": 0, "FAIL": 0,
                                                            "WAITING": 0}
    with sessions(storage_url).begin() as session:
        session.get(TrialRecord, 1).state = "COMPLETE"
        session.get(TrialRecord, 4).stage = "tune"
        session.get(TrialRecord, 2).study_name = "b"
        session.get(TrialRecord, 3).value = 4.2  # not a counted column
    assert _counters_match_the_trials(storage_url)["a"]["COMPLETE"] == 3
    with sessions(storage_url).begin() as session:
        session.execute(update(TrialRecord).where(TrialRecord.study_name == "a").values(state="PRUNED"))
        session.execute(delete(TrialRecord).where(TrialRecord.trial_id == 5))
    counts = _counters_match_the_trials(storage_url)
    assert counts["a"]["PRUNED"] == 3 and counts["b"] == {"COMPLETE": 0, "RUNNING": 1, "PRUNED": 0, "FAIL": 0,
                                                          "WAITING": 0}


def test_the_counters_migration_counts_existing_trials(storage_url):
    from lm_tuner.tuner.store.engine import sessions

    ensure_schema(storage_url)
    config = alembic_config(storage_url)
    with engine_for(storage_url).begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0001")
    with engine_for(storage_url).begin() as connection:  # 0001's tables: no counters, no triggers
        connection.exec_driver_sql(
            "INSERT INTO lmt_studies (name, status, spec, families, document, submitted_via, created_at) "
            "VALUES ('old', 'complete', '{}', ',lstm,', '', 'cli', '2026-01-01')")
        for trial_id, state, stage in [(1, "COMPLETE", "tune"), (2, "COMPLETE", "tune"), (3, "FAIL", "tune"),
                                       (4, "COMPLETE", "rerun")]:
            connection.exec_driver_sql(
                "INSERT INTO lmt_trials (trial_id, study_name, family, stage, state, number, seed, interrupted, "
                f"turns_reported) VALUES ({trial_id}, 'old', 'lstm', '{stage}', '{state}', {trial_id}, 0, false, 0)")
    ensure_schema(storage_url)
    assert _counters_match_the_trials(storage_url)["old"]["COMPLETE"] == 2
    with sessions(storage_url).begin() as session:
        session.add(_trial(5, "old", "COMPLETE"))
    assert _counters_match_the_trials(storage_url)["old"]["COMPLETE"] == 3


def test_reads_survive_a_database_restart(postgres_url):
    """Reads skip the pool's ping: a connection the server dropped (as a restart does) costs a retry,
    not an error."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from lm_tuner.tuner.run.queue import submit_study
    from lm_tuner.tuner.spec import parse_spec
    from lm_tuner.tuner.store.studies import list_studies
    from tests.conftest import TINY_SPEC

    ensure_schema(postgres_url)
    submit_study(postgres_url, parse_spec(TINY_SPEC), "document")
    assert [study.name for study in list_studies(postgres_url).items] == ["tiny"]  # a pooled connection now
    database = make_url(postgres_url).database
    with create_engine(make_url(postgres_url), isolation_level="AUTOCOMMIT").connect() as admin:
        ended = admin.scalar(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                  "WHERE datname = :database AND pid <> pg_backend_pid()"), {"database": database})
    assert ended >= 1
    assert [study.name for study in list_studies(postgres_url).items] == ["tiny"]


def test_trials_read_back_with_their_exact_hyperparameters(storage_url):
    """Hyperparameters travel inside each trial's row (as JSON): floats to the last bit, ints and
    categories as Optuna returns them, in Optuna's order, wherever a trial is read."""
    import optuna

    from lm_tuner.tuner.run.queue import submit_study
    from lm_tuner.tuner.spec import parse_spec
    from lm_tuner.tuner.store.engine import optuna_storage, sessions
    from lm_tuner.tuner.store.studies import get_study, list_studies
    from lm_tuner.tuner.store.trials import get_trial, study_trials
    from tests.conftest import TINY_SPEC

    ensure_schema(storage_url)
    submit_study(storage_url, parse_spec(TINY_SPEC), "document")
    study = optuna.create_study(storage=optuna_storage(storage_url), study_name="tiny/lstm")
    study.enqueue_trial({"learning_rate": 0.0012345678901234567, "layers": 2, "cell": "mogrifier"})
    trial = study.ask()
    trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True)
    trial.suggest_int("layers", 1, 3)
    trial.suggest_categorical("cell", ["lstm", "mogrifier"])
    study.tell(trial, 4.5)
    stored = study.trials[0].params
    with sessions(storage_url).begin() as session:
        record = _trial(trial._trial_id, "tiny", "COMPLETE")
        record.value = 4.5
        session.add(record)
    reads = [get_trial(storage_url, trial._trial_id), get_study(storage_url, "tiny").best,
             list_studies(storage_url).items[0].best, study_trials(storage_url, "tiny").items[0]]
    for read in reads:
        assert list(read.params.items()) == list(stored.items())
        assert type(read.params["layers"]) is int
    assert stored["learning_rate"] == 0.0012345678901234567
