"""What users install: the wheel carries templates and migrations; the image and compose file are coherent."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent
PACKAGES = ("models", "trainers", "tuner", "api", "dashboards")


@pytest.mark.slow
def test_wheel_carries_package_data(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(ROOT)], check=True)
    (wheel,) = tmp_path.glob("lm_tuner-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("dashboards/templates/study.html", "dashboards/static/dashboard.js",
                     "dashboards/static/vendor/plotly-basic-4.1.1.min.js", "dashboards/static/api_docs.js",
                     "dashboards/templates/api_redoc.html", "dashboards/static/vendor/swagger-ui-5.35.0-bundle.js",
                     "dashboards/static/vendor/swagger-ui-5.35.0.css", "dashboards/static/vendor/swagger-ui-LICENSE",
                     "dashboards/static/vendor/redoc-2.5.4.standalone.js", "dashboards/static/vendor/redoc-LICENSE",
                     "tuner/store/migrations/env.py",
                     "tuner/store/migrations/script.py.mako", "tuner/store/migrations/versions/0001_project_tables.py",
                     "models/csrc/cpu_kernels.cpp", "spaces/mogrifier_ptb.yaml", "spaces/small/mogrifier_ptb.yaml",
                     "tuner/spec/throughput.json"):
        assert f"lm_tuner/{required}" in names, required
    assert any(name.endswith("entry_points.txt") for name in names)
    top_level = {name.split("/")[0] for name in names}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"lm_tuner"}


def test_every_package_folder_is_installed():
    """pyproject.toml lists the packages by hand (the folders map into the lm_tuner namespace), data-only folders
    too: none forgotten."""
    configured = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {f"lm_tuner.{'.'.join(path.parent.relative_to(ROOT).parts)}"
               for package in (*PACKAGES, "spaces") for path in (ROOT / package).rglob("*")
               if path.is_file() and "__pycache__" not in path.parts}
    assert configured == folders


def test_dockerfile_copies_every_package():
    copied = set(re.findall(r"^COPY (\w+) \1$", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE))
    assert set(PACKAGES) <= copied


def test_compose_file_validates_against_the_compose_spec():
    checker = Path(sys.executable).parent / "check-jsonschema"
    run = subprocess.run([str(checker), "--builtin-schema", "vendor.compose-spec", str(ROOT / "docker-compose.yml")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_docker_compose_accepts_the_compose_file():
    """Debian's docker-compose (installed by `make setup`) parses and interpolates the file; no engine needed."""
    run = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_compose_services_are_wired_together():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "ray-head", "ray-gpu-worker", "api", "runner"} <= set(services)
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
    assert "healthcheck" in services["postgres"] and "postgres" in services["postgres"]["volumes"][0]
    tuner_services = [s for s in services.values() if s.get("image", "").startswith("${LM_TUNER")]
    assert len(tuner_services) == 5  # schema, ray-head, ray-gpu-worker, api, runner share the artifact volume
    for service in tuner_services:
        assert "artifacts:/data/artifacts" in service["volumes"]
        assert "@postgres:5432/" in service["environment"]["LM_TUNER_STORAGE"]
    gpu = services["ray-gpu-worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and gpu["capabilities"] == ["gpu"]
    assert services["api"]["command"][0] == "serve"
    # the runner's driver joins the Ray cluster as a node (a driver off the cluster cannot connect), then runs
    runner = services["runner"]
    assert runner["entrypoint"] == ["sh", "-c"] and runner["command"][0].startswith("ray start --address=ray-head:6379")
    assert runner["command"][0].endswith("&& exec tuner worker")
    # No open doors: the API listens on every interface with authentication on from its first start (its token
    # from $LM_TUNER_API_TOKEN, else printed once), and Ray's dashboard, which runs jobs, is on loopback only.
    api = services["api"]
    assert api["command"][api["command"].index("--host") + 1] == "0.0.0.0" and "--insecure" not in api["command"]
    assert api["command"][api["command"].index("--initial-token") + 1] == "compose"
    assert "LM_TUNER_API_TOKEN" in api["environment"]
    published = [port for service in services.values() for port in service.get("ports", [])]
    assert [port for port in published if not port.startswith("127.0.0.1:")] == ["${LM_TUNER_PORT:-8000}:8000"]
    assert set(compose["volumes"]) == {"postgres", "artifacts", "triton-cache"}
    worker = services["ray-gpu-worker"]  # its own environment and volumes, on top of the shared ones
    assert "triton-cache:" + worker["environment"]["TRITON_CACHE_DIR"] in worker["volumes"]


def test_setup_says_what_each_step_does_before_it_starts(tmp_path):
    """pip runs quietly and the installs take a minute or more: `make setup` names each step first (a dry run here:
    nothing is installed)."""
    # --no-print-directory: run under `make test` (as CI runs the suite), make says where it enters and leaves
    dry = subprocess.run(["make", "--no-print-directory", "-n", "-B", f"VENV={tmp_path / 'venv'}", "setup"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()

    def first(text: str) -> int:
        return next(number for number, line in enumerate(lines) if text in line)

    steps = [("setup 1/4: a virtual environment in", "-m venv"),
             ("setup 2/4: installing torch 2.13.0, ", 'pip install --quiet "torch==2.13.0"'),
             ("setup 3/4: installing lm-tuner and its dependencies", 'pip install --quiet -e ".[test]"'),
             ("setup 4/4: building the C++ kernels for recurrent layers on CPUs", "tuner kernels build")]
    said = [(first(announced), first(command)) for announced, command in steps]
    assert all(announced < command for announced, command in said), dry.stdout
    assert [announced for announced, _ in said] == sorted(announced for announced, _ in said)
    assert "setup done: " in lines[-1]
