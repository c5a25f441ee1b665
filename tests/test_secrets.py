"""The database's password stays secret: masked (`***`) in every message and output, never on a command line, never in
what Ray Tune saves to disk. PostgreSQL here trusts every local connection, so a URL with any password connects for
real: the commands below run against the database, not against a refusal to connect."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from sqlalchemy.engine import make_url

from lm_tuner.tuner.settings import PrivateUrl, Settings, masked_url
from tests.conftest import TINY_SPEC

PASSWORD = f"Pw-{uuid.uuid4().hex[:16]}"  # nowhere else in any output by chance
SPEC = {**TINY_SPEC, "name": "secret-study", "families": ["lstm"], "fixed": {"num_layers": 1},
        "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
        "tuning": {"sampler": "random", "trials": 1, "concurrency": 1}}
SESSION_ENVIRONMENT = dict(os.environ)  # before the session's Ray fixture adds variables of its own


@pytest.fixture
def secret_url(postgres_url) -> str:
    """A fresh PostgreSQL database, reached by a URL with a password in it."""
    return make_url(postgres_url).set(password=PASSWORD).render_as_string(hide_password=False)


def tuner(*args: str, cwd: Path, url: str, timeout: float = 300, **variables: str) -> subprocess.CompletedProcess:
    """`tuner ARGS` with the URL given only in $LM_TUNER_STORAGE, as docs/cluster.md tells users to."""
    environment = {**SESSION_ENVIRONMENT, "COLUMNS": "200", "LM_TUNER_HOME": str(cwd / "home"),
                   "LM_TUNER_STORAGE": url, **variables}
    return subprocess.run([sys.executable, "-m", "lm_tuner.tuner", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=timeout)


def holding_the_password(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and not path.is_symlink()
            and PASSWORD.encode() in path.read_bytes()]


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql+psycopg://tuner:s3cr%40t@db:5432/tuner", "postgresql+psycopg://tuner:***@db:5432/tuner"),
    ("postgresql://tuner:p@ss/word@db/tuner", "postgresql://tuner:***@db/tuner"),  # an unescaped @ and /: all hidden
    ("postgresql://tuner:@db/tuner", "postgresql://tuner:***@db/tuner"),
    ("postgresql://tuner@db/tuner?password=hunter2&sslmode=require",
     "postgresql://tuner@db/tuner?password=***&sslmode=require"),
    ("sftp://me:hunter2@host/artifacts", "sftp://me:***@host/artifacts"),
    ("https://bucket.example/a?X-Amz-Credential=AKIA&X-Amz-Signature=abc&part=1",
     "https://bucket.example/a?X-Amz-Credential=***&X-Amz-Signature=***&part=1"),
    ("postgresql://tuner@db:5432/tuner", "postgresql://tuner@db:5432/tuner"),
    ("sqlite:////data/a:b@c/tuner.db", "sqlite:////data/a:b@c/tuner.db"),  # a path, however odd
    ("s3://bucket/prefix", "s3://bucket/prefix"),
    ("/plain/folder", "/plain/folder"),
])
def test_masked_url_hides_the_password_and_nothing_else(url, shown):
    assert masked_url(url) == shown


def test_a_pickled_settings_holds_the_url_masked_and_comes_back_whole(tmp_path):
    url = f"postgresql+psycopg://tuner:{PASSWORD}@db/tuner"
    settings = Settings.from_options(url, tmp_path)
    pickled = pickle.dumps(settings)
    assert PASSWORD.encode() not in pickled and b"tuner:***@db" in pickled
    assert pickle.loads(pickled) == settings and pickle.loads(pickled).storage_url == url

    elsewhere = [sys.executable, "-c", "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).storage_url)"]
    given = {**SESSION_ENVIRONMENT, "LM_TUNER_STORAGE": url}
    assert subprocess.run(elsewhere, input=pickled, env=given, capture_output=True).stdout.decode().strip() == url
    unknown = {key: value for key, value in SESSION_ENVIRONMENT.items() if key != "LM_TUNER_STORAGE"}
    refused = subprocess.run(elsewhere, input=pickled, env=unknown, capture_output=True)
    assert refused.returncode != 0 and b"set $LM_TUNER_STORAGE" in refused.stderr
    assert PASSWORD.encode() not in refused.stderr


def test_optunas_storage_pickles_without_the_password(secret_url):
    from lm_tuner.tuner.store.engine import optuna_storage

    storage = optuna_storage(PrivateUrl(secret_url))
    pickled = pickle.dumps(storage)
    assert PASSWORD.encode() not in pickled
    unpickled = pickle.loads(pickled)
    try:
        assert unpickled.get_all_studies() == []  # it reconnects, with the password
    finally:
        unpickled.engine.dispose()
        storage.engine.dispose()


def test_errors_before_any_database_show_the_url_masked(tmp_path):
    unparsable = tuner("status", "x", cwd=tmp_path, url=f"postgresql+nodriver://tuner:{PASSWORD}@db/tuner")
    assert unparsable.returncode == 2 and "$LM_TUNER_STORAGE: got 'postgresql+nodriver://tuner:***@db/tuner'" \
        in unparsable.stderr
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unreachable = tuner("status", "x", cwd=tmp_path, url=f"postgresql://tuner:{PASSWORD}@127.0.0.1:{closed}/tuner")
    assert unreachable.returncode == 1 and "Connection refused" in unreachable.stderr
    for run in (unparsable, unreachable):
        assert PASSWORD not in run.stdout + run.stderr


@pytest.mark.slow
def test_the_main_commands_never_show_the_password_nor_leave_it_in_rays_files(tmp_path, secret_url):
    space = tmp_path / "secret.yaml"
    space.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    ray_temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    try:
        runs = {"db upgrade": tuner("db", "upgrade", cwd=tmp_path, url=secret_url),
                "launch": tuner("launch", "--space", str(space), cwd=tmp_path, url=secret_url,
                                RAY_TMPDIR=str(ray_temp))}
        assert runs["launch"].returncode == 0, runs["launch"].stderr
        assert holding_the_password(tmp_path / "home") == []  # the artifact store, its _ray folder among them
        assert holding_the_password(ray_temp) == []  # Ray's session: logs, and its own copies of what Tune saved
    finally:
        shutil.rmtree(ray_temp, ignore_errors=True)
    elsewhere = tmp_path / "elsewhere"
    runs |= {
        "launch refusal": tuner("launch", "--space", str(space), "--artifacts", str(elsewhere), cwd=tmp_path,
                                url=secret_url),
        "status": tuner("status", "secret-study", cwd=tmp_path, url=secret_url),
        "status of no study": tuner("status", "nope", cwd=tmp_path, url=secret_url),
        "compare": tuner("compare", "secret-study", cwd=tmp_path, url=secret_url),
        "compare of no study": tuner("compare", "nope", cwd=tmp_path, url=secret_url),
        "best": tuner("best", "secret-study", cwd=tmp_path, url=secret_url),
        "list": tuner("list", cwd=tmp_path, url=secret_url),
        "worker": tuner("worker", "--once", cwd=tmp_path, url=secret_url),
    }
    for command, run in runs.items():
        assert PASSWORD not in run.stdout + run.stderr, command
    masked = masked_url(secret_url)
    assert f"{masked}: schema at revision" in runs["db upgrade"].stdout
    assert f"database {masked}" in runs["launch"].stdout
    assert runs["launch refusal"].returncode == 2 and "wrote its checkpoints to" in runs["launch refusal"].stderr
    assert runs["status"].returncode == 0 and "secret-study (complete)" in runs["status"].stdout
    assert f"no study named 'nope' in {masked}" in runs["status of no study"].stderr
    assert f"no study named 'nope' in {masked}" in runs["compare of no study"].stderr
    assert runs["worker"].returncode == 0


@pytest.mark.slow
def test_the_worker_that_serve_starts_has_no_password_on_its_command_line(tmp_path, secret_url):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    environment = {**SESSION_ENVIRONMENT, "LM_TUNER_HOME": str(tmp_path / "home"), "LM_TUNER_STORAGE": secret_url}
    server = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "serve", "--port", str(port)], cwd=tmp_path,
                              env=environment, stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        worker = _worker_connected_to_postgres(server.pid, 120, log)
        for process in [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]:
            assert PASSWORD not in Path(f"/proc/{process.pid}/cmdline").read_text(), process.cmdline()
        assert "worker" in worker.cmdline()
        assert worker.environ()["LM_TUNER_STORAGE"] == secret_url  # how it reached the database: its environment
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=90) == 0
    output = log.read_text()
    assert f"dashboard: http://127.0.0.1:{port}/dashboard" in output and PASSWORD not in output


def _worker_connected_to_postgres(parent: int, seconds: float, log: Path) -> psutil.Process:
    """The child of `parent` that has a connection open to PostgreSQL's port, once it has one."""
    port = make_url(os.environ.get("LMT_TEST_POSTGRES", "postgresql://127.0.0.1:5432")).port or 5432
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for child in psutil.Process(parent).children():
            try:
                if any(connection.raddr and connection.raddr.port == port for connection in child.net_connections()):
                    return child
            except psutil.Error:
                continue
        time.sleep(0.5)
    raise AssertionError(f"serve's worker did not connect to PostgreSQL; serve's output:\n{log.read_text()}")


def test_a_private_url_and_its_text_share_one_engine_and_one_optuna_storage(tmp_path):
    from lm_tuner.tuner.store.engine import engine_for, optuna_storage

    url = f"sqlite:///{tmp_path / 'one.db'}"
    assert engine_for(PrivateUrl(url)) is engine_for(url)  # one connection pool per database, not two
    assert optuna_storage(PrivateUrl(url)) is optuna_storage(url)
