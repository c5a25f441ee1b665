"""Connecting to the database: engines per URL, sessions, Optuna's storage on the same database, and the
schema brought up to date by Alembic (under a lock, so concurrent first starts do not race)."""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache, wraps
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import optuna
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    Engine,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from lm_tuner.tuner.settings import PrivateUrl
from lm_tuner.tuner.store.file_identity import watch_file_identity

P = ParamSpec("P")


T = TypeVar("T")


SCHEMA_LOCK_KEY = 0x6C6D74  # "lmt": the PostgreSQL advisory lock taken while creating the schema


VERSION_TABLE = "lmt_alembic_version"  # Optuna keeps its own migrations in "alembic_version"


MIGRATIONS = Path(__file__).parent / "migrations"


def normalize_url(url: str) -> str:
    """Accept plain `postgresql://` URLs by choosing the psycopg 3 driver the project installs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _engine_kwargs(url: str, *, ping: bool = True) -> dict[str, Any]:
    if _is_sqlite(url):
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": ping}


def engine_for(url: str) -> Engine:
    """One engine per database, whether its URL comes as a PrivateUrl or as plain text (a cache keyed on the URL as
    given made two, with two connection pools)."""
    return _engine(str(url))


@lru_cache(maxsize=8)
def _engine(url: str) -> Engine:
    url = normalize_url(url)
    return _configured(create_engine(url, **_engine_kwargs(url)), url)


def _configured(engine: Engine, url: str) -> Engine:
    if _is_sqlite(url):
        event.listen(engine, "connect", _sqlite_pragmas)
        _watch_sqlite_file(engine, url)
    return engine


def _watch_sqlite_file(engine: Engine, url: str) -> None:
    """A SQLite file deleted or replaced under this process raises DatabaseReplaced from `engine` (file_identity)."""
    database = make_url(url).database
    if _is_sqlite(url) and database and database != ":memory:" and not database.startswith("file:"):
        watch_file_identity(engine, Path(database).absolute())


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers (API) never block the writer (controller)
    cursor.execute("PRAGMA busy_timeout=60000")
    cursor.close()


def reading(url: str) -> Connection:
    """A connection for reads, in autocommit mode: no BEGIN and ROLLBACK round trips around a few SELECTs
    (each statement sees its own snapshot). Unlike `engine_for`'s, it is not pinged when taken from the
    pool (a round trip per request): functions that read through it are `retried_on_disconnect`."""
    return _reading_engine(url).connect()


@lru_cache(maxsize=8)
def _reading_engine(url: str) -> Engine:
    url = normalize_url(url)
    return _configured(create_engine(url, isolation_level="AUTOCOMMIT", **_engine_kwargs(url, ping=False)), url)


def retried_on_disconnect(read: Callable[P, T]) -> Callable[P, T]:
    """Runs a read once more if its pooled connection turned out to be dead (the database restarted);
    SQLAlchemy has then dropped every connection the pool held, so the second try gets a fresh one."""
    @wraps(read)
    def retried(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return read(*args, **kwargs)
        except DBAPIError as error:
            if not error.connection_invalidated:
                raise
            return read(*args, **kwargs)
    return retried


def sessions(url: str) -> sessionmaker[Session]:
    return sessionmaker(engine_for(url), expire_on_commit=False)


def optuna_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's storage on the same database, one whether its URL comes as a PrivateUrl or as plain text; creating it
    also creates Optuna's tables."""
    return _optuna_storage(str(url))


@lru_cache(maxsize=8)
def _optuna_storage(url: str) -> optuna.storages.RDBStorage:
    url = normalize_url(url)
    storage = optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
    _watch_sqlite_file(storage.engine, url)
    storage.url = PrivateUrl(storage.url)  # unpickled, it reconnects from it; Ray pickles it to disk: no password
    return storage


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def ensure_schema(url: str) -> None:
    """Bring Optuna's and the project's tables to the current version, creating them if missing.

    Safe to call from several processes at once: creation is serialised by a lock (an advisory lock
    on PostgreSQL, a lock file beside a SQLite database).
    """
    url = normalize_url(url)
    config = alembic_config(url)
    head = ScriptDirectory.from_config(config).get_current_head()
    if _has_tables(url) and current_revision(url) == head:
        return
    with _schema_lock(url):
        engine = engine_for(url)
        engine.connect().close()  # WAL mode set before Optuna opens the file
        optuna_storage(url)
        if current_revision(url) != head:
            with engine.begin() as connection:
                config.attributes["connection"] = connection
                command.upgrade(config, "head")


def current_revision(url: str) -> str | None:
    with engine_for(url).connect() as connection:
        return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def _has_tables(url: str) -> bool:
    if _is_sqlite(url):
        database = make_url(url).database
        if not database or database == ":memory:" or not Path(database).exists():
            return False
    return inspect(engine_for(url)).has_table(VERSION_TABLE)


@contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    if _is_sqlite(url):
        database = make_url(url).database
        if not database or database == ":memory:":
            yield
            return
        Path(database).parent.mkdir(parents=True, exist_ok=True)
        with open(f"{database}.schema-lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return
    with engine_for(url).connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
        try:
            yield
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": SCHEMA_LOCK_KEY})
