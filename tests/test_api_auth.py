"""Authentication: on from the first token until an explicit `auth off`, never turned off by a revocation; reads
need a token only with private reads; the OpenAPI document says which operations need one on this server; a
server listening beyond loopback refuses to start with authentication off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.engine import ensure_schema
from lm_tuner.tuner.store.tokens import (
    TokenError,
    auth_enabled,
    create_token,
    initial_token,
    revoke_token,
    set_auth,
    token_is_valid,
)
from tests.conftest import TINY_SPEC, serve_app

SPEC = json.dumps({**TINY_SPEC, "name": "guarded"})


def test_writes_need_a_token_once_one_exists(sqlite_url, tmp_path):
    settings = Settings(sqlite_url, tmp_path / "artifacts")
    ensure_schema(sqlite_url)
    with serve_app(settings) as base, httpx.Client(base_url=base) as client:
        assert client.post("/studies", content=json.dumps({**TINY_SPEC, "name": "open"})).status_code == 202
        token = create_token(sqlite_url, "ci")
        refused = client.post("/studies", content=SPEC)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        wrong = client.post("/studies", content=SPEC, headers={"Authorization": "Bearer lmt_wrong"})
        assert wrong.status_code == 401 and "unknown or revoked" in wrong.json()["detail"]
        assert client.post("/studies/open/cancel").status_code == 401
        assert client.delete("/studies/open").status_code == 401
        authorised = {"Authorization": f"Bearer {token}"}
        assert client.post("/studies", content=SPEC, headers=authorised).status_code == 202
        assert client.get("/studies").json()["total"] == 2  # reads stay open by default
        revoke_token(sqlite_url, "ci")
        # Revoking the last token locks writes; it never opens the API again.
        assert client.post("/studies/open/cancel").status_code == 401
        assert client.post("/studies/open/cancel", headers=authorised).status_code == 401
        set_auth(sqlite_url, False)  # only an explicit `tuner auth off` does
        assert client.post("/studies/open/cancel").status_code == 202


def test_private_reads_need_a_token_too(sqlite_url, tmp_path):
    settings = Settings(sqlite_url, tmp_path / "artifacts", private_reads=True)
    ensure_schema(sqlite_url)
    token = create_token(sqlite_url, "reader")
    create_token(sqlite_url, "other")
    with serve_app(settings) as base, httpx.Client(base_url=base) as client:
        for path in ("/studies", "/studies/x", "/studies/x/trials", "/trials/1", "/dashboard/fragments/studies"):
            assert client.get(path).status_code == 401, path
        sign_in = client.get("/dashboard/studies/x?refresh=9")  # a page a person opens: the sign-in page first
        assert sign_in.status_code == 303
        assert sign_in.headers["location"] == "/dashboard/sign-in?next=%2Fdashboard%2Fstudies%2Fx%3Frefresh%3D9"
        assert client.get("/health").status_code == 200
        assert client.get("/studies", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        revoke_token(sqlite_url, "reader")
        assert client.get("/studies", headers={"Authorization": f"Bearer {token}"}).status_code == 401


def test_token_names_are_unique_and_revocation_needs_an_active_token(sqlite_url):
    ensure_schema(sqlite_url)
    create_token(sqlite_url, "ci")
    with pytest.raises(TokenError, match="exists"):
        create_token(sqlite_url, "ci")
    revoke_token(sqlite_url, "ci")
    with pytest.raises(TokenError, match="no active token"):
        revoke_token(sqlite_url, "ci")


def test_token_cli(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuner.db'}"

    def tuner(*args):
        return subprocess.run([sys.executable, "-m", "lm_tuner.tuner", "token", *args, "--storage", url],
                              capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})

    created = tuner("create", "laptop")
    assert created.returncode == 0 and created.stdout.strip().startswith("lmt_")
    assert "laptop" in tuner("list").stdout
    assert tuner("revoke", "laptop").returncode == 0
    again = tuner("revoke", "laptop")
    assert again.returncode == 2 and "no active token" in again.stderr
    bracketed = tuner("create", "[bold]laptop")  # shown as typed, not taken for console markup
    assert bracketed.returncode == 2 and "error: name: got '[bold]laptop'; allowed: 1-64 letters" in bracketed.stderr


def test_authentication_is_a_state_of_the_database(storage_url):
    ensure_schema(storage_url)
    assert not auth_enabled(storage_url)
    with pytest.raises(TokenError, match="no active token"):
        set_auth(storage_url, True)  # nobody could write
    create_token(storage_url, "ci")
    assert auth_enabled(storage_url)
    revoke_token(storage_url, "ci")
    assert auth_enabled(storage_url)
    set_auth(storage_url, False)
    assert not auth_enabled(storage_url)
    with pytest.raises(TokenError, match="name: got"):
        create_token(storage_url, "bad\x00name")


def test_a_deployment_gets_its_first_token_once(sqlite_url):
    ensure_schema(sqlite_url)
    secret = initial_token(sqlite_url, "compose")
    assert secret.startswith("lmt_") and auth_enabled(sqlite_url)
    assert initial_token(sqlite_url, "compose") is None  # a later start
    set_auth(sqlite_url, False)  # an operator's explicit choice is kept on restart
    assert initial_token(sqlite_url, "compose") is None and not auth_enabled(sqlite_url)


def test_a_given_secret_becomes_the_first_token(sqlite_url):
    ensure_schema(sqlite_url)
    with pytest.raises(TokenError, match="at least 24"):
        initial_token(sqlite_url, "compose", "short")
    given = "a-secret-from-the-deployment-0123456789"
    assert initial_token(sqlite_url, "compose", given) == given
    settings = Settings(sqlite_url, Path("unused"))
    with serve_app(settings) as base, httpx.Client(base_url=base) as client:
        assert client.post("/studies", content=SPEC).status_code == 401
        assert client.post("/studies", content=SPEC, headers={"Authorization": f"Bearer {given}"}).status_code == 202


def test_an_existing_active_token_turns_authentication_on_when_migrating(storage_url):
    from alembic import command

    from lm_tuner.tuner.store.engine import alembic_config, engine_for

    ensure_schema(storage_url)
    config = alembic_config(storage_url)
    with engine_for(storage_url).begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0002")
    with engine_for(storage_url).begin() as connection:  # a deployment protected by a token before 0003
        connection.exec_driver_sql("INSERT INTO lmt_api_tokens (name, token_sha256, created_at) "
                                   "VALUES ('old', 'digest', '2026-01-01')")
    ensure_schema(storage_url)
    assert auth_enabled(storage_url)


@pytest.mark.parametrize("private_reads", [False, True], ids=["public-reads", "private-reads"])
def test_openapi_declares_the_security_this_server_enforces(sqlite_url, tmp_path, private_reads):
    ensure_schema(sqlite_url)
    token = create_token(sqlite_url, "ci")
    settings = Settings(sqlite_url, tmp_path / "artifacts", private_reads=private_reads)
    with serve_app(settings) as base, httpx.Client(base_url=base) as client:
        paths = client.get("/openapi.json").json()["paths"]
        operations = {(path, method): operation for path, methods in paths.items()
                      for method, operation in methods.items()}
        for (path, method), operation in operations.items():
            if path == "/health":
                assert "security" not in operation
                continue
            guarded = method != "get" or private_reads
            assert (operation.get("security") == [{"HTTPBearer": []}]) == guarded, (path, method)
            assert ("401" in operation["responses"]) == guarded, (path, method)
            if method == "get" and "{" not in path:  # the document is right: each read answers as it says
                answer = client.get(path)
                assert (answer.status_code == 401) == guarded, (path, answer.status_code)
                assert client.get(path, headers={"Authorization": f"Bearer {token}"}).status_code != 401


def test_auth_cli_turns_authentication_off_only_explicitly(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuner.db'}"

    def tuner(*args):
        return subprocess.run([sys.executable, "-m", "lm_tuner.tuner", *args, "--storage", url], capture_output=True,
                              text=True, env={**os.environ, "COLUMNS": "200"})

    assert "authentication off" in tuner("auth", "status").stdout
    refused = tuner("auth", "on")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "no active token" in refused.stderr
    assert tuner("token", "create", "laptop").returncode == 0
    assert tuner("token", "revoke", "laptop").returncode == 0
    assert "authentication on: writes need a valid token; 0 active token(s)" in tuner("auth", "status").stdout
    assert tuner("auth", "off").returncode == 0
    assert "authentication off" in tuner("auth", "status").stdout


def _serve(url: str, *options: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "serve", "--storage", url, "--port", str(port),
                               "--no-worker", *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "COLUMNS": "200", **(env or {})})
    return server, port


def _stopped_after_answering(server: subprocess.Popen, port: int) -> str:
    """Wait until the server answers, stop it with SIGTERM (exit 0 expected) and return what it printed."""
    import signal
    import time

    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, server.communicate()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
    server.send_signal(signal.SIGTERM)
    out, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    return out


def test_listening_beyond_loopback_needs_authentication_or_insecure(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    refused, _ = _serve(url, "--host", "0.0.0.0")
    out, err = refused.communicate(timeout=60)
    assert refused.returncode == 2 and err.count("\n") == 1, err
    assert "--host 0.0.0.0: listening beyond this machine with authentication off" in err and "--insecure" in err
    private, _ = _serve(url, "--private-reads")
    assert private.wait(timeout=60) == 2 and "--private-reads: authentication is off" in private.stderr.read()

    _stopped_after_answering(*_serve(url, "--host", "0.0.0.0", "--insecure"))
    first = _stopped_after_answering(*_serve(url, "--host", "0.0.0.0", "--initial-token", "compose"))
    secret = first.split("shown only this once: ")[1].split()[0]
    assert "created API token 'compose'" in first and token_is_valid(url, secret) and auth_enabled(url)
    again = _stopped_after_answering(*_serve(url, "--host", "0.0.0.0", "--initial-token", "compose"))
    assert "created API token" not in again  # printed once, at the first start only
