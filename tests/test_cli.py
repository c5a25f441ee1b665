"""The `tuner` command as a user runs it: real processes, exit codes and output."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas
import pytest
import yaml

from tests.conftest import TINY_SPEC

pytestmark = pytest.mark.slow

ONE_FAMILY = {**TINY_SPEC, "families": ["lstm"], "fixed": {"num_layers": 1},
              "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}}}


# The environment as the session began: ray.init in this process (the session's Ray fixture) adds
# variables of its own, RAY_AUTH_MODE=token among them, which the CLI's own Ray must not inherit.
SESSION_ENVIRONMENT = dict(os.environ)


def environment(folder) -> dict[str, str]:
    return {**SESSION_ENVIRONMENT, "COLUMNS": "200", "LM_TUNER_HOME": str(folder / "home")}


def tuner(*args: str, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lm_tuner.tuner",
                           *args], cwd=cwd, env=environment(cwd), capture_output=True,
                          text=True, timeout=timeout)


def test_help_explains_every_command(tmp_path):
    result = tuner("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in ("launch", "status", "list", "serve", "worker"):
        assert command in result.stdout
    launch_help = tuner("launch", "--help", cwd=tmp_path).stdout
    assert "--space" in launch_help and "--storage" in launch_help and "continues" in launch_help
    assert "[default: $LM_TUNER_STORAGE, else" in launch_help  # shown, not taken for a console style tag
    assert "identical spec) continues it. The warnings of tuner plan (without its probe)" in launch_help  # refolded


def test_invalid_spec_exits_2_with_file_line_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**ONE_FAMILY, "parameter_budget": -5}, sort_keys=False))
    result = tuner("launch", "--space", str(path), cwd=tmp_path)
    assert result.returncode == 2
    line = path.read_text().splitlines().index("parameter_budget: -5") + 1
    assert f"{path}:{line}: parameter_budget: Input should be greater than or equal to 1" in result.stderr


def _one_line_error(result: subprocess.CompletedProcess, *expected: str) -> None:
    """Exit status 2 and exactly one line on stderr, naming the problem: no traceback."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["plan", "launch"])
def test_a_space_that_is_not_a_regular_file_is_refused_at_once(tmp_path, command):
    """A FIFO would make `open` wait for a writer forever, /dev/zero would never end: each is one line, exit 2."""
    import socket as sockets

    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    listening = sockets.socket(sockets.AF_UNIX)
    listening.bind(str(tmp_path / "spec.sock"))
    try:
        for given, kind in [(fifo, "a FIFO (named pipe)"), (tmp_path, "a folder"), ("/dev/zero", "a character device"),
                            (tmp_path / "spec.sock", "a socket")]:
            refused = tuner(command, "--space", str(given), *(["--no-probe"] if command == "plan" else []),
                            cwd=tmp_path, timeout=60)
            _one_line_error(refused, f"--space: '{given}' is {kind}, not a file")
    finally:
        listening.close()


def test_wrong_input_is_one_line_and_exit_2(tmp_path):
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"\x80\x02PK\x00\x00" + bytes(range(256)))
    _one_line_error(tuner("launch", "--space", str(binary), cwd=tmp_path), str(binary), "not a text file")
    _one_line_error(tuner("launch", "--space", str(tmp_path), cwd=tmp_path), "--space", "is a folder")
    _one_line_error(tuner("launch", "--space", "absent.yaml", cwd=tmp_path), "absent.yaml",
                    "no such file or shipped space", "small/mogrifier_ptb")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({**ONE_FAMILY, "families": ["lstm", "transformer-xl"]}, sort_keys=False))
    _one_line_error(tuner("launch", "--space", str(unknown), cwd=tmp_path), f"{unknown}:", "families.1",
                    "'transformer-xl'")
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump({**ONE_FAMILY, "parameter_budget": 10}, sort_keys=False))
    _one_line_error(tuner("launch", "--space", str(tiny), cwd=tmp_path), "parameter_budget")
    _one_line_error(tuner("status", "x", "--storage", "nosuchdb://x", cwd=tmp_path), "--storage")
    debugged = tuner("--debug", "status", "x", "--storage", "nosuchdb://x", cwd=tmp_path)
    assert debugged.returncode != 0 and "Traceback" in debugged.stderr


def test_missing_data_creates_nothing_and_a_study_that_never_ran_can_be_launched_again(tmp_path):
    from lm_tuner.tuner.run.queue import run_worker, submit_study
    from lm_tuner.tuner.settings import Settings
    from lm_tuner.tuner.spec import parse_spec
    from lm_tuner.tuner.store.engine import ensure_schema, sessions
    from lm_tuner.tuner.store.schema import StudyRecord

    typo = {**ONE_FAMILY, "name": "typo", "dataset": {"path": str(tmp_path / "ptbb"), "format": "ptb"}}
    space = tmp_path / "typo.yaml"
    space.write_text(yaml.safe_dump(typo, sort_keys=False))
    _one_line_error(tuner("launch", "--space", str(space), cwd=tmp_path), "dataset", str(tmp_path / "ptbb"))
    assert json.loads(tuner("list", "--json", cwd=tmp_path).stdout) == []  # nothing half-made

    # Submitted over REST, the same typo fails in the worker before any trial ran...
    url = f"sqlite:///{tmp_path / 'home' / 'tuner.db'}"
    ensure_schema(url)
    submit_study(url, parse_spec(typo), yaml.safe_dump(typo))
    run_worker(Settings(url, tmp_path / "home" / "artifacts"), once=True)
    with sessions(url)() as session:
        assert session.query(StudyRecord.status).one() == ("failed",)
    # ...and the corrected spec is launched under the same name.
    space.write_text(yaml.safe_dump({**typo, "dataset": ONE_FAMILY["dataset"]}, sort_keys=False))
    launched = tuner("launch", "--space", str(space), cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    assert json.loads(tuner("status", "typo", "--json", cwd=tmp_path).stdout)["counts"]["COMPLETE"] == 1


def test_launch_then_status_and_list(tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({**ONE_FAMILY, "name": "cli-study"}, sort_keys=False))
    launched = tuner("launch", "--space", str(path), cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    assert "complete  cli-study/lstm#0" in launched.stdout
    assert "1/1 done" in launched.stdout
    assert (tmp_path / "home" / "tuner.db").is_file()  # the documented default storage

    status = tuner("status", "cli-study", "--json", cwd=tmp_path)
    payload = json.loads(status.stdout)
    assert payload["status"] == "complete" and payload["counts"]["COMPLETE"] == 1
    assert payload["trials"][0]["family"] == "lstm"
    table = tuner("status", "cli-study", cwd=tmp_path).stdout
    assert "cli-study (complete)" in table and "best possible perplexity" in table

    listed = json.loads(tuner("list", "--json", cwd=tmp_path).stdout)
    assert [study["name"] for study in listed] == ["cli-study"]

    best = json.loads(tuner("best", "cli-study", "--json", cwd=tmp_path).stdout)
    assert best["lstm"]["value"] == payload["trials"][0]["value"]
    assert best["lstm"]["checkpoint"]["url"].endswith("/checkpoint")
    elsewhere = tmp_path / "elsewhere"  # another LM_TUNER_HOME: the checkpoint is where the study wrote it
    elsewhere.mkdir()
    url = f"sqlite:///{tmp_path / 'home' / 'tuner.db'}"
    shown = tuner("best", "cli-study", "--storage", url, cwd=elsewhere).stdout
    (path_shown,) = [line.split("checkpoint ", 1)[1].strip() for line in shown.splitlines() if "checkpoint " in line]
    assert Path(path_shown).is_file() and Path(path_shown).is_relative_to(tmp_path / "home" / "artifacts")

    exported = tmp_path / "trials.csv"
    assert tuner("export", "cli-study", "--format", "csv", "-o", str(exported), cwd=tmp_path).returncode == 0
    table = pandas.read_csv(exported)
    assert list(table["family"]) == ["lstm"] and table["value"][0] == pytest.approx(best["lstm"]["value"])
    assert table["param.learning_rate"][0] == pytest.approx(best["lstm"]["params"]["learning_rate"])
    as_json = json.loads(tuner("export", "cli-study", "--format", "json", cwd=tmp_path).stdout)
    assert as_json[0]["state"] == "COMPLETE"
    wrong = tuner("export", "cli-study", "--format", "xml", cwd=tmp_path)
    assert wrong.returncode == 2 and "allowed: csv, json" in wrong.stderr

    again = tuner("resume", "cli-study", cwd=tmp_path)
    assert again.returncode == 0 and "cli-study (complete)" in again.stdout

    missing = tuner("status", "nope", cwd=tmp_path)
    assert missing.returncode == 1 and "no study named 'nope'" in missing.stderr

    ended = tuner("cancel", "cli-study", cwd=tmp_path)
    assert ended.returncode == 2 and "only queued or running studies can be cancelled" in ended.stderr
    assert tuner("delete", "cli-study", "--yes", cwd=tmp_path).returncode == 0
    assert tuner("status", "cli-study", cwd=tmp_path).returncode == 1
    assert not (tmp_path / "home" / "artifacts" / "cli-study").exists()


def test_interrupted_launch_leaves_no_zombie_and_continues(tmp_path):
    import optuna
    from optuna.trial import TrialState

    path = tmp_path / "slow.yaml"
    slow = {**ONE_FAMILY, "name": "slow", "training": {**TINY_SPEC["training"], "steps_per_turn": 400},
            "tuning": {"sampler": "random", "trials": 2, "concurrency": 1}}
    path.write_text(yaml.safe_dump(slow, sort_keys=False))
    # Started with SIGINT ignored, as a script's background job is: the launch must still stop on it.
    launch = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "launch", "--space", str(path)], cwd=tmp_path,
                              env=environment(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    database = tmp_path / "home" / "tuner.db"
    url = f"sqlite:///{database}"

    def running() -> bool:  # read-only, so the poll never creates the database the launch is creating
        try:
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
                return connection.execute("SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0] > 0
        except sqlite3.OperationalError:  # no database or no tables yet
            return False

    _wait_for(running, 120, "no trial started")
    launch.send_signal(signal.SIGINT)
    assert launch.wait(timeout=120) == 130
    assert "`tuner resume slow` (or the same launch) continues the study" in launch.stderr.read()
    states = [t.state for t in optuna.load_study(study_name="slow/lstm", storage=url).get_trials()]
    assert TrialState.RUNNING not in states and TrialState.FAIL in states

    resumed = tuner("resume", "slow", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    states = [t.state for t in optuna.load_study(study_name="slow/lstm", storage=url).get_trials()]
    assert states.count(TrialState.COMPLETE) == 2 and TrialState.RUNNING not in states


def test_serve_with_its_worker_runs_a_submitted_study(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    server = subprocess.Popen([sys.executable, "-m", "lm_tuner.tuner", "serve", "--port", str(port)], cwd=tmp_path,
                              env=environment(tmp_path), stdout=log.open("w"), stderr=subprocess.STDOUT,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # a background job
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_for(lambda: _answers(client), 60, "the server did not start")
            document = yaml.safe_dump({**ONE_FAMILY, "name": "over-rest"}, sort_keys=False)
            assert client.post("/studies", content=document).status_code == 202
            _wait_for(lambda: client.get("/studies/over-rest").json()["status"] in ("complete", "failed"), 240,
                      "the worker did not finish the submitted study")
            study = client.get("/studies/over-rest").json()
            assert study["status"] == "complete" and study["counts"]["COMPLETE"] == 1
            # The database says complete a moment before the worker has tidied up and logged it.
            _wait_for(lambda: "study over-rest finished: complete" in log.read_text(), 60, "the worker did not log")
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=90) == 0
    output = log.read_text()
    assert "dashboard: http://127.0.0.1" in output
    assert "study over-rest finished: complete" in output and "worker stopped" in output


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def _wait_for(condition, seconds: float, message: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.5)
