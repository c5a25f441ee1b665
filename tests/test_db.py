"""The schema: created and migrated by Alembic, safely from several processes, matching the models."""

from __future__ import annotations

import subprocess
import sys

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from tuner.db import VERSION_TABLE, alembic_config, current_revision, engine_for, ensure_schema

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
    upgrade = [sys.executable, "-m", "tuner", "db", "upgrade", "--storage", url]
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

    from tests.conftest import TINY_SPEC
    from tuner.db import StudyRecord, sessions
    from tuner.queue import requeue_study, submit_study
    from tuner.spec import parse_spec

    ensure_schema(storage_url)
    submit_study(storage_url, parse_spec(TINY_SPEC), "document")
    with sessions(storage_url).begin() as session:
        session.execute(update(StudyRecord).where(StudyRecord.name == TINY_SPEC["name"]).values(status=status))
    requeue_study(storage_url, TINY_SPEC["name"])
    with sessions(storage_url)() as session:
        assert session.scalar(select(StudyRecord.status).where(StudyRecord.name == TINY_SPEC["name"])) == after
