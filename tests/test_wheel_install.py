"""What `pip install lm-tuner` gives a user: the wheel, built from the sdist and installed into a fresh environment
outside the repository, runs `tuner` from any folder, with the shipped spaces found by name."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
# As the session began: a Ray fixture in this process adds variables the installed `tuner` must not inherit.
SESSION_ENVIRONMENT = dict(os.environ)
LOCATION_VARIABLES = ("PYTHONPATH", "VIRTUAL_ENV", "LM_TUNER_STORAGE", "LM_TUNER_ARTIFACTS")
FASTEST_TWIN = "small/lstm_ptb"  # one family, a generated corpus: no download
FASTEST_TWIN_STUDY = "small-lstm-ptb"


@dataclass(frozen=True)
class Installed:
    python: Path  # the fresh environment's interpreter
    site_packages: Path
    work: Path  # a folder outside the repository, the working directory of every command
    environment: dict[str, str]

    def run(self, command: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.python.parent / command), *args], cwd=self.work, env=self.environment,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built as a release is: the sdist, then the wheel from the unpacked sdist (so the sdist must be complete, and
    nothing left in the repository's build/ folder can slip in)."""
    dist = tmp_path_factory.mktemp("dist")
    # setuptools validates the classifiers against trove-classifiers, or else a list it downloads: not in a test.
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                           capture_output=True, text=True, timeout=300,
                           env={**SESSION_ENVIRONMENT, "VALIDATE_PYPROJECT_NO_NETWORK": "1"})
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert len(list(dist.glob("lm_tuner-*.tar.gz"))) == 1
    (built_wheel,) = dist.glob("lm_tuner-*.whl")
    return built_wheel


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    """A new virtual environment with the project's dependencies (from this environment, without lm_tuner and its
    editable finder) and the wheel installed by pip."""
    root = tmp_path_factory.mktemp("installed")
    assert not root.is_relative_to(ROOT)
    environment_folder = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(environment_folder)], check=True)
    python = environment_folder / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_packages = Path(subprocess.run([str(python), "-c", where], capture_output=True, text=True, check=True)
                         .stdout.strip())
    dependencies = root / "dependencies"
    dependencies.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("lm_tuner", "__editable__")):
            (dependencies / entry.name).symlink_to(entry)
    (site_packages / "dependencies.pth").write_text(f"{dependencies}\n")
    work = root / "work"
    work.mkdir()
    environment = {name: value for name, value in SESSION_ENVIRONMENT.items() if name not in LOCATION_VARIABLES}
    environment.update(LM_TUNER_HOME=str(root / "home"), COLUMNS="200")

    probe = [str(python), "-c", "import torch, typer; import lm_tuner.tuner"]
    before = subprocess.run(probe, cwd=work, env=environment, capture_output=True, text=True)
    assert before.returncode == 1 and "No module named 'lm_tuner'" in before.stderr, before.stderr
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                          "--disable-pip-version-check", "--quiet", str(wheel)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return Installed(python, site_packages, work, environment)


def test_the_wheel_installs_lm_tuner_only_with_the_shipped_spaces(wheel):
    with zipfile.ZipFile(wheel) as archive:
        dist_info = next(name.split("/")[0] for name in archive.namelist() if name.endswith(".dist-info/RECORD"))
        record = archive.read(f"{dist_info}/RECORD").decode()
    recorded = {row[0] for row in csv.reader(io.StringIO(record))}
    assert {path.split("/")[0] for path in recorded} == {"lm_tuner", dist_info}
    twins = {f"lm_tuner/spaces/small/{path.name}" for path in (ROOT / "spaces" / "small").glob("*.yaml")}
    assert twins and twins | {"lm_tuner/spaces/mogrifier_ptb.yaml"} <= recorded
    assert f"{dist_info}/licenses/LICENSE" in recorded


def test_the_sdist_carries_what_its_tests_and_docs_need(wheel):
    sdist = next(wheel.parent.glob("*.tar.gz"))
    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "docs/spec.md", "docs/methodology.md", "deploy", "benchmarks/cell_throughput.py",
            "tests/test_deploy.py"} <= members


def test_the_installed_package_is_imported_from_the_new_environment(installed):
    shown = installed.run("python", "-c", "import lm_tuner, lm_tuner.tuner, lm_tuner.spaces; "
                                          "print(list(lm_tuner.__path__), lm_tuner.tuner.__file__)")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [f"['{installed.site_packages / 'lm_tuner'}']",
                                    str(installed.site_packages / "lm_tuner" / "tuner" / "__init__.py")]


def test_tuner_help_and_version(installed, wheel):
    helped = installed.run("tuner", "--help")
    assert helped.returncode == 0 and "launch" in helped.stdout and "serve" in helped.stdout, helped.stderr
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = (name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        version = HeaderParser().parsestr(archive.read(metadata).decode())["Version"]
    shown = installed.run("tuner", "--version")
    assert shown.returncode == 0 and shown.stdout.strip() == f"lm-tuner {version}", shown.stdout + shown.stderr


def test_tuner_spaces_lists_the_shipped_spaces(installed):
    listed = installed.run("tuner", "spaces", "--json")
    assert listed.returncode == 0, listed.stderr
    names = {space["name"] for space in json.loads(listed.stdout)}
    assert {"mogrifier_ptb", "quickstart", FASTEST_TWIN} <= names


def test_a_shipped_twin_launched_by_name_is_served(installed):
    started = time.monotonic()
    launched = installed.run("tuner", "launch", "--space", FASTEST_TWIN, timeout=300)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    print(f"tuner launch --space {FASTEST_TWIN}: {time.monotonic() - started:.0f} s")

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = installed.work / "serve.log"
    server = subprocess.Popen([str(installed.python.parent / "tuner"), "serve", "--port", str(port), "--no-worker"],
                              cwd=installed.work, env=installed.environment, stdout=log.open("w"),
                              stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 60
            while not _answers(client):
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the server did not start: " + log.read_text()
                time.sleep(0.5)
            studies = client.get("/studies")
            assert studies.status_code == 200, studies.text
            listed = {study["name"]: study["status"] for study in studies.json()["items"]}
            assert listed == {FASTEST_TWIN_STUDY: "complete"}
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0, log.read_text()


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/health").status_code == 200
    except httpx.TransportError:
        return False
