"""Bearer tokens: writes need one as soon as one exists; reads only with private reads; revocation holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from tests.conftest import TINY_SPEC, serve_app
from tuner.db import ensure_schema
from tuner.settings import Settings
from tuner.tokens import TokenError, create_token, revoke_token

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
        # With no active token left, the server is open again; a revoked token is not needed.
        assert client.post("/studies/open/cancel").status_code == 202


def test_private_reads_need_a_token_too(sqlite_url, tmp_path):
    settings = Settings(sqlite_url, tmp_path / "artifacts", private_reads=True)
    ensure_schema(sqlite_url)
    token = create_token(sqlite_url, "reader")
    create_token(sqlite_url, "other")
    with serve_app(settings) as base, httpx.Client(base_url=base) as client:
        for path in ("/studies", "/studies/x", "/studies/x/trials", "/trials/1", "/dashboard"):
            assert client.get(path).status_code == 401, path
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
        return subprocess.run([sys.executable, "-m", "tuner", "token", *args, "--storage", url],
                              capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})

    created = tuner("create", "laptop")
    assert created.returncode == 0 and created.stdout.strip().startswith("lmt_")
    assert "laptop" in tuner("list").stdout
    assert tuner("revoke", "laptop").returncode == 0
    again = tuner("revoke", "laptop")
    assert again.returncode == 2 and "no active token" in again.stderr
