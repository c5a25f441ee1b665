"""One default place for a user's studies: `tuner launch` and `tuner serve` find the same database from any folder
(this user's data folder; $LM_TUNER_HOME overrides), the launch header names it, and the default database of earlier
versions (./lm-tuner-data/tuner.db) is pointed out, once, where it is no longer the one used."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from lm_tuner.tuner import settings
from lm_tuner.tuner.settings import HOME_VARIABLE, STORAGE_VARIABLE, Settings, default_storage, home
from tests.conftest import TINY_SPEC

SESSION_ENVIRONMENT = dict(os.environ)  # before the session's Ray fixture adds variables the CLI's Ray must not see
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the XDG data folder is Linux's")


@pytest.fixture
def no_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HOME_VARIABLE, raising=False)
    monkeypatch.delenv(STORAGE_VARIABLE, raising=False)
    monkeypatch.setattr(settings, "_noticed", [])


@linux
def test_the_default_home_is_the_users_data_folder_whatever_the_working_folder(tmp_path, monkeypatch, no_home):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    for folder in (tmp_path, Path("/")):
        monkeypatch.chdir(folder)
        assert home() == tmp_path / "xdg" / "lm-tuner"
        assert default_storage() == f"sqlite:///{tmp_path / 'xdg' / 'lm-tuner' / 'tuner.db'}"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert home() == tmp_path / "user" / ".local" / "share" / "lm-tuner"
    monkeypatch.setenv(HOME_VARIABLE, "relative/home")  # still overrides, from the working folder
    assert home() == Path("/relative/home")


def test_an_earlier_default_database_here_is_pointed_out_once_when_another_is_used(tmp_path, monkeypatch, no_home,
                                                                                   caplog):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lm-tuner-data").mkdir()
    (tmp_path / "lm-tuner-data" / "tuner.db").touch()
    with caplog.at_level(logging.WARNING, logger="lm_tuner.tuner.settings"):
        Settings.from_options(None, None)
        Settings.from_options(None, None)
    (notice,) = caplog.messages
    assert notice == (f"note: {tmp_path}/lm-tuner-data/tuner.db (the default database of earlier versions) is not "
                      f"used; the default is now {home() / 'tuner.db'}. To go on with it, set "
                      f"LM_TUNER_HOME={tmp_path}/lm-tuner-data, or move that folder to {home()}")


def test_no_notice_where_the_earlier_database_is_the_one_used_or_another_is_asked_for(tmp_path, monkeypatch, no_home,
                                                                                     caplog):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lm-tuner-data").mkdir()
    (tmp_path / "lm-tuner-data" / "tuner.db").touch()
    with caplog.at_level(logging.WARNING, logger="lm_tuner.tuner.settings"):
        Settings.from_options(f"sqlite:///{tmp_path / 'other.db'}", None)  # --storage
        monkeypatch.setenv(HOME_VARIABLE, "lm-tuner-data")
        Settings.from_options(None, None)
    assert caplog.messages == []


def environment(tmp_path: Path) -> dict[str, str]:
    """The session's environment without LM_TUNER_HOME, with this test's user data folder."""
    variables = {name: value for name, value in SESSION_ENVIRONMENT.items() if name not in (HOME_VARIABLE,
                                                                                             STORAGE_VARIABLE)}
    return {**variables, "XDG_DATA_HOME": str(tmp_path / "xdg"), "COLUMNS": "200", "RAY_AUTH_MODE": "disabled"}


def tuner(*arguments: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lm_tuner.tuner", *arguments], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@linux
@pytest.mark.slow
def test_launch_in_one_folder_and_serve_in_another_share_the_database(tmp_path):
    env = environment(tmp_path)
    one, other = tmp_path / "one", tmp_path / "other"
    one.mkdir()
    other.mkdir()
    spec = {**TINY_SPEC, "name": "anywhere", "families": ["lstm"], "fixed": {"num_layers": 1},
            "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
            "tuning": {**TINY_SPEC["tuning"], "sampler": "random"}}
    (one / "spec.yaml").write_text(yaml.safe_dump(spec))
    launched = tuner("launch", "--space", "spec.yaml", cwd=one, env=env)
    assert launched.returncode == 0, launched.stderr
    database = tmp_path / "xdg" / "lm-tuner" / "tuner.db"
    assert f"database sqlite:///{database}" in launched.stdout  # the header says where
    assert not (one / "lm-tuner-data").exists()
    assert [study["name"] for study in json.loads(tuner("list", "--json", cwd=other, env=env).stdout)] == ["anywhere"]

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "serve", "--no-worker", "--port", str(port)],
                              cwd=other, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                studies = httpx.get(f"http://127.0.0.1:{port}/studies", timeout=10)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.25)
        assert [study["name"] for study in studies.json()["items"]] == ["anywhere"]
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0
    assert not (other / "lm-tuner-data").exists()
