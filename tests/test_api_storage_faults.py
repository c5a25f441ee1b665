"""The server never acknowledges what it could not store: a SQLite file deleted or replaced under `tuner serve` makes
it refuse requests with 503 and a message (it answered 202 to a submission into a deleted file), and a full disk is
answered 507 Insufficient Storage, saying so (it was a bare 500): a SQLite database filled for real (its page count
capped), PostgreSQL's disk_full error and a full disk under the server's own files, injected."""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from lm_tuner.api import submission
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.engine import engine_for, ensure_schema
from tests.conftest import TINY_SPEC, serve_app

YAML = {"Content-Type": "application/yaml"}


def _spec(name: str, **fields: object) -> str:
    return yaml.safe_dump({**TINY_SPEC, "name": name, **fields}, sort_keys=False)


@pytest.fixture
def served(storage_url, tmp_path) -> Iterator[tuple[httpx.Client, str]]:
    settings = Settings(storage_url, tmp_path / "artifacts")
    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
        yield client, storage_url


@pytest.fixture
def served_sqlite(sqlite_url, tmp_path) -> Iterator[tuple[httpx.Client, Path, Settings]]:
    settings = Settings(sqlite_url, tmp_path / "artifacts")
    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
        yield client, tmp_path / "tuner.db", settings


def _names_in(database: Path) -> list[str]:
    with sqlite3.connect(database) as connection:
        return [name for (name,) in connection.execute("SELECT name FROM lmt_studies ORDER BY name")]


def test_a_deleted_database_file_is_refused_not_written_to(served_sqlite):
    client, database, _ = served_sqlite
    assert client.post("/studies", content=_spec("first"), headers=YAML).status_code == 202
    database.unlink()

    submitted = client.post("/studies", content=_spec("second"), headers=YAML)
    listed = client.get("/studies")

    assert submitted.status_code == 503, submitted.text
    assert submitted.json()["detail"].startswith(f"database: {database} was deleted after this process opened it")
    assert listed.status_code == 503
    assert not database.exists()  # no new, empty database made in its place either


def test_a_replaced_database_file_is_refused_and_left_alone(served_sqlite, tmp_path):
    client, database, _ = served_sqlite
    assert client.post("/studies", content=_spec("first"), headers=YAML).status_code == 202
    other = tmp_path / "other.db"
    ensure_schema(f"sqlite:///{other}")
    os.replace(other, database)  # e.g. a backup restored over it while the server runs

    submitted = client.post("/studies", content=_spec("second"), headers=YAML)

    assert submitted.status_code == 503, submitted.text
    assert "was replaced by another file after this process opened it" in submitted.json()["detail"]
    assert _names_in(database) == []  # the new file was not written to by a server that does not know it


def test_a_full_sqlite_database_is_answered_507_and_stores_nothing(served_sqlite):
    client, database, settings = served_sqlite
    engine = engine_for(settings.storage_url)  # the server's
    with engine.connect() as connection:
        connection.exec_driver_sql("VACUUM")  # no free page left
        pages = connection.exec_driver_sql("PRAGMA page_count").scalar()

    def capped(dbapi_connection, _record) -> None:
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")  # the file may not grow: a full disk

    event.listen(engine, "connect", capped)
    engine.dispose()  # the server's next connections are capped
    try:
        submitted = client.post("/studies", content=_spec("big", description="x" * 20_000), headers=YAML)
    finally:
        event.remove(engine, "connect", capped)
        engine.dispose()

    assert submitted.status_code == 507, submitted.text
    assert submitted.json()["detail"].startswith("the database's disk is full: nothing was stored")
    assert _names_in(database) == []


@pytest.mark.parametrize("fault, answer", [
    (OperationalError("INSERT INTO lmt_studies", {}, psycopg.errors.DiskFull("could not extend file")), 507),
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 507),
    (OperationalError("INSERT INTO lmt_studies", {}, psycopg.errors.QueryCanceled("canceling statement")), 500),
])
def test_a_full_disk_is_said_so_and_other_faults_stay_errors(served, monkeypatch, fault, answer):
    client, _ = served

    def full(*args: object, **kwargs: object) -> None:
        raise fault

    monkeypatch.setattr(submission, "submit_study", full)
    submitted = client.post("/studies", content=_spec("first"), headers=YAML)

    assert submitted.status_code == answer, submitted.text
    if answer == 507:
        assert "disk is full" in submitted.json()["detail"] and "nothing was stored" in submitted.json()["detail"]
