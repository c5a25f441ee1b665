"""The REST API and dashboard over real HTTP, against a database holding a real (tiny) study."""

from __future__ import annotations

import hashlib
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
import yaml

from api.app import create_app
from tests.conftest import TINY_SPEC
from trainers import load_checkpoint
from tuner.controller import launch_study
from tuner.db import CheckpointRecord, sessions
from tuner.queue import run_worker
from tuner.settings import Settings
from tuner.spec import parse_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def service(ray_cluster, tmp_path_factory) -> Iterator[tuple[httpx.Client, Settings]]:
    root = tmp_path_factory.mktemp("service")
    settings = Settings(f"sqlite:///{root / 'tuner.db'}", root / "artifacts")
    document = yaml.safe_dump({**TINY_SPEC, "name": "served"}, sort_keys=False)
    assert launch_study(parse_spec(document), document, settings) == "complete"
    with _serve(settings) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
        yield client, settings


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _serve:
    """uvicorn in a background thread, for the duration of a with-block."""

    def __init__(self, settings: Settings) -> None:
        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port,
                                                   log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the API server did not start"
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def test_health(service):
    client, _ = service
    assert client.get("/health").json() == {"status": "ok"}


def test_studies_list_and_detail(service):
    client, _ = service
    listed = {s["name"]: s for s in client.get("/studies").json()}
    study = listed["served"]
    assert study["status"] == "complete"
    assert study["families"] == ["lstm", "mogrifier"]
    assert study["counts"]["COMPLETE"] == 2 and study["trials_finished"] == study["trials_expected"] == 2
    detail = client.get("/studies/served").json()
    assert detail["spec"]["parameter_budget"] == TINY_SPEC["parameter_budget"]
    assert detail["best_perplexity"] == pytest.approx(math.exp(detail["best"]["value"]))
    assert detail["best_possible_perplexity"] > 1
    assert client.get("/studies/absent").status_code == 404


def test_trials_carry_params_sizes_and_checkpoints(service):
    client, _ = service
    trials = client.get("/studies/served/trials").json()
    assert sorted(t["family"] for t in trials) == ["lstm", "mogrifier"]
    for trial in trials:
        assert trial["state"] == "COMPLETE"
        assert trial["parameter_count"] <= TINY_SPEC["parameter_budget"]
        assert trial["checkpoint"]["url"] == f"/trials/{trial['trial_id']}/checkpoint"
        assert "learning_rate" in trial["params"]
    detail = client.get(f"/trials/{trials[0]['trial_id']}").json()
    assert [turn["turn"] for turn in detail["learning_curve"]] == [1, 2, 3]
    assert min(turn["val_loss"] for turn in detail["learning_curve"]) == detail["value"]
    assert client.get("/trials/99999").status_code == 404


def test_pareto_figure_has_one_trace_per_family_and_the_front(service):
    client, _ = service
    trials = client.get("/studies/served/trials").json()
    figure = client.get("/studies/served/pareto").json()
    traces = {trace["name"]: trace for trace in figure["data"]}
    assert set(traces) == {"lstm", "mogrifier", "non-dominated"}
    for trial in trials:
        trace = traces[trial["family"]]
        assert trace["x"] == [trial["parameter_count"]]
        assert trace["y"] == pytest.approx([trial["perplexity"]])
    assert traces["lstm"]["marker"]["color"] != traces["mogrifier"]["marker"]["color"]
    assert 1 <= len(traces["non-dominated"]["x"]) <= 2
    assert figure["layout"]["yaxis"]["title"]["text"] == "validation perplexity"


def test_checkpoint_download_matches_its_checksum_and_loads(service, tmp_path):
    client, settings = service
    trial = client.get("/studies/served/trials").json()[0]
    response = client.get(trial["checkpoint"]["url"])
    assert response.status_code == 200
    digest = hashlib.sha256(response.content).hexdigest()
    assert digest == response.headers["x-checkpoint-sha256"] == trial["checkpoint"]["sha256"]
    downloaded = tmp_path / "best.pt"
    downloaded.write_bytes(response.content)
    assert load_checkpoint(downloaded).metadata["val_loss"] == trial["value"]


def test_checkpoint_paths_cannot_leave_the_artifact_store(service):
    client, settings = service
    trial_id = client.get("/studies/served/trials").json()[0]["trial_id"]
    outside = Path(settings.artifact_root).parent / "secret.txt"
    outside.write_text("not yours")
    with sessions(settings.storage_url).begin() as session:
        record = session.get(CheckpointRecord, trial_id)
        original, record.path = record.path, "../secret.txt"
    try:
        assert client.get(f"/trials/{trial_id}/checkpoint").status_code == 403
    finally:
        with sessions(settings.storage_url).begin() as session:
            session.get(CheckpointRecord, trial_id).path = original


def test_invalid_submissions_are_422_with_fields_and_lines(service):
    client, _ = service
    bad = yaml.safe_dump({**TINY_SPEC, "name": "bad", "tuning": {"sampler": "annealing", "trials": 1}})
    response = client.post("/studies", content=bad, headers={"content-type": "application/yaml"})
    assert response.status_code == 422
    (issue,) = response.json()["detail"]
    assert issue["field"] == "tuning.sampler" and "'gp', 'tpe', 'random' or 'qmc'" in issue["message"]
    assert bad.splitlines()[issue["line"] - 1].strip().startswith("sampler:")
    broken = client.post("/studies", content="name: [unclosed\n")
    assert broken.status_code == 422 and "not valid YAML/JSON" in broken.json()["detail"][0]["message"]
    assert client.post("/studies", content=b"x" * 300_000).status_code == 413


def test_submitted_study_is_queued_then_run_by_a_worker(service):
    client, settings = service
    document = {**TINY_SPEC, "name": "submitted", "families": ["lstm"], "fixed": {"num_layers": 1},
                "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}}}
    response = client.post("/studies", content=json.dumps(document), headers={"content-type": "application/json"})
    assert response.status_code == 202
    assert response.json() == {"name": "submitted", "status": "queued", "url": "/studies/submitted"}
    assert client.get("/studies/submitted").json()["status"] == "queued"
    assert client.post("/studies", content=json.dumps(document)).status_code == 409

    assert run_worker(settings, once=True) == 1

    study = client.get("/studies/submitted").json()
    assert study["status"] == "complete" and study["counts"]["COMPLETE"] == 1
    assert client.get("/studies/submitted/trials").json()[0]["checkpoint"] is not None


def test_dashboard_pages_render(service):
    client, _ = service
    listing = client.get("/dashboard")
    assert listing.status_code == 200 and 'href="/dashboard/studies/served"' in listing.text
    page = client.get("/dashboard/studies/served")
    assert page.status_code == 200
    assert 'data-src="/studies/served/pareto"' in page.text
    trials = client.get("/studies/served/trials").json()
    for trial in trials:
        assert f'href="/trials/{trial["trial_id"]}/checkpoint"' in page.text
        assert f"{trial['perplexity']:.3f}" in page.text
    assert "best possible perplexity" in page.text
    script = client.get("/static/plotly.min.js")
    assert script.status_code == 200 and "plotly" in script.text[:2000].lower()
    assert client.get("/dashboard/studies/absent").status_code == 404


def test_openapi_documents_every_endpoint(service):
    client, _ = service
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/studies", "/studies/{name}", "/studies/{name}/trials", "/studies/{name}/pareto",
            "/trials/{trial_id}", "/trials/{trial_id}/checkpoint", "/health"} <= set(paths)
    assert "post" in paths["/studies"]
    assert client.get("/docs").status_code == 200
