"""Shared fixtures: a real local Ray, a fresh PostgreSQL database per test, tiny study specs."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
# The default database and artifacts (tuner.settings.home) of every test, and of the commands tests start, in a
# folder of their own, never this user's data folder: set before test modules copy the environment for their
# subprocesses, and again for each test by `private_home`.
os.environ["LM_TUNER_HOME"] = tempfile.mkdtemp(prefix="lm-tuner-home-")

# rich fixes a console's width for good when it is made with COLUMNS set, so the CLI's consoles are made here,
# without it: every test's own COLUMNS (CliRunner's env) then counts, whichever test imports the CLI first.
os.environ.pop("COLUMNS", None)
import pytest  # noqa: E402
import yaml  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

import lm_tuner.tuner.cli.common  # noqa: E402, F401

POSTGRES_SERVER = os.environ.get("LMT_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

TINY_SPEC = {
    "name": "tiny",
    "dataset": {"generator": "markov", "vocab_size": 20, "train_tokens": 6000, "valid_tokens": 1200,
                "test_tokens": 1200},
    "families": ["lstm", "mogrifier"],
    "parameter_budget": 8000,
    "training": {"turns": 3, "steps_per_turn": 4, "batch_size": 8, "bptt": 10, "eval_batch_size": 4},
    "fixed": {"num_layers": 1, "mogrifier_rank": 2},
    "search_space": {
        "learning_rate": {"low": 0.001, "high": 0.01, "log": True},
        "mogrifier_rounds": {"low": 1, "high": 4},
    },
    "tuning": {"sampler": "gp", "trials": 1, "concurrency": 2},
}


@pytest.fixture(autouse=True)
def private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's default database and artifacts in a new folder (tests that need another set their own)."""
    monkeypatch.setenv("LM_TUNER_HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture
def tiny_spec() -> Callable[..., str]:
    """A YAML study small enough to run in seconds; keyword arguments replace top-level fields."""

    def build(**fields: object) -> str:
        return yaml.safe_dump({**TINY_SPEC, **fields}, sort_keys=False)

    return build


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for the test, then as it was."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    yield
    ray.shutdown()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A new, empty database on the PostgreSQL server, dropped afterwards."""
    server = make_url(POSTGRES_SERVER)
    name = f"lmt_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        from lm_tuner.tuner.store import engine as db

        db.engine_for(url).dispose()
        db.optuna_storage(url).engine.dispose()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    with fresh_postgres_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def storage_url(request) -> str:
    """Each test using it runs twice: on a SQLite file and on a fresh PostgreSQL database."""
    return request.getfixturevalue(f"{request.param}_url")


@contextmanager
def serve_app(settings) -> Iterator[str]:
    """The API (create_app) served by uvicorn in a background thread; yields its base URL."""
    import socket
    import threading
    import time

    import uvicorn

    from lm_tuner.api.app import create_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the API server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
