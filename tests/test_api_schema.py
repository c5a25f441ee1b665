"""Schemathesis (its CLI) against the live API's OpenAPI schema: every operation, every check.

The server runs as it would in production with tokens: writes and reads need the bearer token, which
schemathesis sends; its auth checks also try requests without it and with a wrong one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.tokens import create_token
from tests.conftest import TINY_SPEC, serve_app

pytestmark = pytest.mark.slow
CONFIG = Path(__file__).parent / "schemathesis.toml"


def test_schemathesis_finds_no_failure(ray_cluster, tmp_path):
    settings = Settings(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts", private_reads=True)
    document = yaml.safe_dump({**TINY_SPEC, "name": "served"})
    assert launch_study(parse_spec(document), document, settings) == "complete"
    token = create_token(settings.storage_url, "schemathesis")
    executable = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    with serve_app(settings) as base_url:
        run = subprocess.run(
            [executable, "--config-file", str(CONFIG), "run", f"{base_url}/openapi.json", "--max-examples", "40",
             "--phases", "examples,coverage,fuzzing", "--suppress-health-check", "all", "--workers", "1",
             "--header", f"Authorization: Bearer {token}", "--seed", "1"],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,  # its cache goes in tmp, not the repo
            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "160"})
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failure" not in run.stdout.split("SUMMARY")[-1].lower()
