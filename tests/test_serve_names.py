"""`tuner serve --allowed-host` and `--data-folder` (and their variables): the Host names a server answers to and the
folders a submitted spec may read, from the command line to the answers of a running server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from lm_tuner.tuner.cli.served_names import answered_hosts, shown_hosts
from tests.conftest import TINY_SPEC
from tests.test_cli import _answers, _wait_for, environment, tuner


def test_serve_answers_the_names_it_is_given_and_reads_data_only_in_its_folders(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = tmp_path / "data"
    data.mkdir()
    log = tmp_path / "serve.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "lm_tuner.tuner", "serve", "--port", str(port), "--no-worker",
         "--allowed-host", "tuner.example.org", "--data-folder", str(data)], cwd=tmp_path,
        env={**environment(tmp_path), "LM_TUNER_ALLOWED_HOSTS": "ignored.example"},  # the option wins
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_for(lambda: _answers(client), 60, "the server did not start")
            assert client.get("/studies", headers={"Host": f"tuner.example.org:{port}"}).status_code == 200
            assert client.get("/studies", headers={"Host": "ignored.example"}).status_code == 400
            outside = json.dumps({**TINY_SPEC, "dataset": {"path": str(tmp_path / "elsewhere"), "format": "text"}})
            refused = client.post("/studies/validate", content=outside)
            assert refused.status_code == 403 and str(data) in refused.json()["detail"]
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert "answering requests for localhost, 127.0.0.1, [::1], tuner.example.org (others: --allowed-host NAME)" \
        in log.read_text()


def test_the_variables_give_names_and_folders_too_and_a_missing_folder_is_refused_at_once(tmp_path):
    variables = {"LM_TUNER_ALLOWED_HOSTS": "a.example, b.example", "LM_TUNER_DATA_FOLDERS": str(tmp_path / "none")}
    started = subprocess.run([sys.executable, "-m", "lm_tuner.tuner", "serve", "--port", "1", "--no-worker"],
                             cwd=tmp_path, env={**environment(tmp_path), **variables}, capture_output=True, text=True,
                             timeout=120)
    assert started.returncode == 2 and f"--data-folder {tmp_path / 'none'}: no such folder" in started.stderr
    assert answered_hosts("127.0.0.1", ["a.example, b.example", "c.example"]) == ("a.example", "b.example",
                                                                                   "c.example")


def test_the_address_served_on_is_answered_and_every_interface_answers_this_machine_s_names():
    assert answered_hosts("10.0.0.7", []) == ("10.0.0.7",)
    assert answered_hosts("localhost", []) == () and answered_hosts("::1", []) == ()
    everywhere = answered_hosts("0.0.0.0", ["tuner.example.org"])
    assert everywhere[0] == "tuner.example.org" and socket.gethostname() in everywhere
    assert shown_hosts(("fd00::1",)) == "localhost, 127.0.0.1, [::1], [fd00::1]"
    assert shown_hosts(("*",)).startswith("any Host name")


def test_help_names_the_options(tmp_path):
    result = tuner("serve", "--help", cwd=tmp_path)
    assert "--allowed-host" in result.stdout and "LM_TUNER_ALLOWED_HOSTS" in result.stdout
    assert "--data-folder" in result.stdout and "LM_TUNER_DATA_FOLDERS" in result.stdout


def test_the_deployments_pass_the_names_their_api_is_reached_by():
    import yaml

    root = Path(__file__).parent.parent
    api = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]["api"]
    assert api["environment"]["LM_TUNER_ALLOWED_HOSTS"] == "${LM_TUNER_ALLOWED_HOSTS:-}"  # from the host's .env
    deployment = next(yaml.safe_load_all((root / "deploy" / "kubernetes" / "api.yaml").read_text()))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    variables = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert variables["LM_TUNER_ALLOWED_HOSTS"] == "lm-tuner-api"  # the Service, for clients in the cluster
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"  # asked by the pod's address: answered
