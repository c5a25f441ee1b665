"""The REST API and dashboard over real HTTP, on SQLite and on PostgreSQL, against real (tiny) studies."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import optuna
import plotly
import pytest
import yaml

from lm_tuner.dashboards import PLOTLY_JS
from lm_tuner.trainers import load_checkpoint
from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.run.queue import run_worker
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import CheckpointRecord, StudyRecord, TrialCountRecord, TrialRecord
from tests.conftest import TINY_SPEC, fresh_postgres_database, serve_app

pytestmark = pytest.mark.slow

ONE_FAMILY = {"families": ["lstm"], "fixed": {"num_layers": 1},
              "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}}}


def launch(settings: Settings, **fields) -> None:
    document = yaml.safe_dump({**TINY_SPEC, **fields}, sort_keys=False)
    assert launch_study(parse_spec(document), document, settings) == "complete"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(request, ray_cluster, tmp_path_factory) -> Iterator[tuple[httpx.Client, Settings]]:
    root = tmp_path_factory.mktemp("service")
    with ExitStack() as stack:
        url = (f"sqlite:///{root / 'tuner.db'}" if request.param == "sqlite"
               else stack.enter_context(fresh_postgres_database()))
        settings = Settings(url, root / "artifacts")
        launch(settings, name="served")
        launch(settings, **ONE_FAMILY, name="other", parameter_budget=6000)
        base_url = stack.enter_context(serve_app(settings))
        client = stack.enter_context(httpx.Client(base_url=base_url, timeout=60))
        yield client, settings


def test_health(service):
    client, _ = service
    assert client.get("/health").json() == {"status": "ok"}


def test_studies_list_pages_and_filters(service):
    client, _ = service
    listing = client.get("/studies").json()
    assert listing["total"] == 2 and [s["name"] for s in listing["items"]] == ["other", "served"]  # newest first
    first = client.get("/studies", params={"limit": 1}).json()
    second = client.get("/studies", params={"limit": 1, "offset": 1}).json()
    assert (first["total"], [s["name"] for s in first["items"] + second["items"]]) == (2, ["other", "served"])
    assert [s["name"] for s in client.get("/studies", params={"family": "mogrifier"}).json()["items"]] == ["served"]
    assert [s["name"] for s in client.get("/studies", params={"q": "serv"}).json()["items"]] == ["served"]
    for wildcard in ("%", "_", "e_v", "/"):  # LIKE's wildcards and our escape character match only themselves
        assert client.get("/studies", params={"q": wildcard}).json()["total"] == 0
    assert client.get("/studies", params={"offset": 5}).json() == {"items": [], "total": 2, "limit": 50, "offset": 5}
    assert client.get("/studies", params={"status": "queued"}).json()["total"] == 0
    assert client.get("/studies", params={"status": "bogus"}).status_code == 422
    assert client.get("/studies", params={"limit": 0}).status_code == 422


def test_study_detail(service):
    client, _ = service
    study = client.get("/studies/served").json()
    assert study["status"] == "complete" and study["families"] == ["lstm", "mogrifier"]
    assert study["counts"]["COMPLETE"] == 2 and study["trials_finished"] == study["trials_expected"] == 2
    assert study["progress"] == 1.0 and study["eta_seconds"] is None
    assert study["spec"]["parameter_budget"] == TINY_SPEC["parameter_budget"]
    assert study["best_perplexity"] == pytest.approx(math.exp(study["best"]["value"]))
    assert study["best_possible_perplexity"] > 1
    assert client.get("/studies/absent").status_code == 404


def test_trials_page_sort_and_filter(service):
    client, _ = service
    page = client.get("/studies/served/trials").json()
    assert page["total"] == 2 and sorted(t["family"] for t in page["items"]) == ["lstm", "mogrifier"]
    for trial in page["items"]:
        assert trial["state"] == "COMPLETE" and trial["turns_reported"] == 3 and trial["wall_seconds"] > 0
        assert trial["parameter_count"] <= TINY_SPEC["parameter_budget"]
        assert trial["checkpoint"]["url"] == f"/trials/{trial['trial_id']}/checkpoint"
        assert "learning_rate" in trial["params"]
    by_value = [t["value"] for t in client.get("/studies/served/trials", params={"sort": "value"}).json()["items"]]
    assert by_value == sorted(by_value)
    descending = client.get("/studies/served/trials", params={"sort": "value", "order": "desc"}).json()["items"]
    assert [t["value"] for t in descending] == sorted(by_value, reverse=True)
    only = client.get("/studies/served/trials", params={"family": "mogrifier"}).json()
    assert [t["family"] for t in only["items"]] == ["mogrifier"] and "mogrifier_rounds" in only["items"][0]["params"]
    paged = client.get("/studies/served/trials", params={"limit": 1, "offset": 1}).json()
    assert paged["total"] == 2 and len(paged["items"]) == 1
    assert client.get("/studies/served/trials", params={"state": "FAIL"}).json()["total"] == 0
    assert client.get("/studies/served/trials", params={"sort": "colour"}).status_code == 422
    assert client.get("/studies/absent/trials").status_code == 404


def test_one_trial_with_its_learning_curve(service):
    client, _ = service
    trial_id = client.get("/studies/served/trials").json()["items"][0]["trial_id"]
    detail = client.get(f"/trials/{trial_id}").json()
    assert [turn["turn"] for turn in detail["learning_curve"]] == [1, 2, 3]
    assert min(turn["val_loss"] for turn in detail["learning_curve"]) == detail["value"]
    assert client.get("/trials/99999").status_code == 404


@pytest.mark.parametrize("axis, column", [("params", "parameter_count"), ("wall_seconds", "wall_seconds")])
def test_pareto_figure_and_front(service, axis, column):
    client, _ = service
    trials = client.get("/studies/served/trials").json()["items"]
    body = client.get("/studies/served/pareto", params={"x": axis}).json()
    traces = {trace["name"]: trace for trace in body["figure"]["data"]}
    assert set(traces) == {"lstm", "mogrifier", "non-dominated"}
    for trial in trials:
        assert traces[trial["family"]]["x"] == pytest.approx([trial[column]])
        assert traces[trial["family"]]["y"] == pytest.approx([trial["perplexity"]])
    assert traces["lstm"]["marker"]["color"] != traces["mogrifier"]["marker"]["color"]
    front = body["non_dominated"]
    assert 1 <= len(front) <= 2 and traces["non-dominated"]["x"] == pytest.approx([p["x"] for p in front])
    for point in front:  # nothing beats a front point on both axes
        assert not any(t[column] <= point["x"] and t["perplexity"] < point["perplexity"] for t in trials)
    assert body["figure"]["layout"]["yaxis"]["title"]["text"] == "validation perplexity"
    assert client.get("/studies/served/pareto", params={"x": "colour"}).status_code == 422


def test_checkpoint_download_matches_its_checksum_and_loads(service, tmp_path):
    client, _ = service
    trial = client.get("/studies/served/trials").json()["items"][0]
    response = client.get(trial["checkpoint"]["url"])
    assert response.status_code == 200
    digest = hashlib.sha256(response.content).hexdigest()
    assert digest == response.headers["x-checkpoint-sha256"] == trial["checkpoint"]["sha256"]
    downloaded = tmp_path / "best.pt"
    downloaded.write_bytes(response.content)
    assert load_checkpoint(downloaded).metadata["val_loss"] == trial["value"]


def test_checkpoint_download_reads_the_store_the_study_ran_with(service, tmp_path):
    """A study launched with `--artifacts /big/disk` records that store; the service, configured with another,
    serves its checkpoints from where they are."""
    client, settings = service
    trial = client.get("/studies/served/trials").json()["items"][0]
    default_folder, elsewhere = Path(settings.artifact_root) / "served", tmp_path / "big-disk"
    shutil.move(default_folder, elsewhere / "served")

    def record_root(root: str | None) -> str | None:
        with sessions(settings.storage_url).begin() as session:
            record = session.query(StudyRecord).filter_by(name="served").one()
            previous, record.artifact_root = record.artifact_root, root
        return previous

    recorded = record_root(str(elsewhere))
    try:
        response = client.get(trial["checkpoint"]["url"])
        assert response.status_code == 200, response.text
        assert hashlib.sha256(response.content).hexdigest() == trial["checkpoint"]["sha256"]
    finally:
        record_root(recorded)
        shutil.move(elsewhere / "served", default_folder)


def test_checkpoint_paths_cannot_leave_the_artifact_store(service):
    client, settings = service
    trial_id = client.get("/studies/served/trials").json()["items"][0]["trial_id"]
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
    assert client.post("/studies", content=b"\xff\xfe").status_code == 422
    assert client.post("/studies", content=b"x" * 300_000).status_code == 413

    def chunks():  # no Content-Length: the limit still holds
        for _ in range(300):
            yield b"x" * 1024

    assert client.post("/studies", content=chunks()).status_code == 413


def test_submitted_study_is_queued_then_run_by_a_worker(service):
    client, settings = service
    document = {**TINY_SPEC, **ONE_FAMILY, "name": "submitted"}
    response = client.post("/studies", content=json.dumps(document), headers={"content-type": "application/json"})
    assert response.status_code == 202
    body = response.json()
    assert {key: body[key] for key in ("name", "status", "url")} == {"name": "submitted", "status": "queued",
                                                                     "url": "/studies/submitted"}
    assert all(isinstance(warning, str) for warning in body["warnings"])  # the plan's, e.g. a tiny hidden size
    assert client.get("/studies/submitted").json()["status"] == "queued"
    assert client.post("/studies", content=json.dumps(document)).status_code == 409

    assert run_worker(settings, once=True) == 1

    study = client.get("/studies/submitted").json()
    assert study["status"] == "complete" and study["counts"]["COMPLETE"] == 1
    assert client.get("/studies/submitted/trials").json()["items"][0]["checkpoint"] is not None


def test_cancel_a_queued_study(service):
    client, _ = service
    assert client.post("/studies", content=json.dumps({**TINY_SPEC, **ONE_FAMILY, "name": "never"})).status_code == 202
    assert client.post("/studies/never/cancel").json() == {"name": "never", "status": "cancelled"}
    assert client.get("/studies/never").json()["status"] == "cancelled"
    assert client.post("/studies/never/cancel").status_code == 409
    assert client.post("/studies/served/cancel").status_code == 409  # complete
    assert client.post("/studies/absent/cancel").status_code == 404


def test_cancel_a_running_study_stops_its_trials(service):
    client, settings = service
    slow = {**TINY_SPEC, **ONE_FAMILY, "name": "cancelled",
            "training": {**TINY_SPEC["training"], "steps_per_turn": 3000},
            "tuning": {"sampler": "random", "trials": 3, "concurrency": 1}}
    assert client.post("/studies", content=json.dumps(slow)).status_code == 202
    worker = threading.Thread(target=run_worker, args=(settings,), kwargs={"once": True})
    worker.start()
    deadline = time.monotonic() + 120
    while client.get("/studies/cancelled").json()["counts"]["RUNNING"] == 0:
        assert time.monotonic() < deadline, "the trial did not start"
        time.sleep(0.5)
    assert client.post("/studies/cancelled/cancel").json()["status"] == "cancelling"
    assert client.delete("/studies/cancelled").status_code == 409  # still stopping
    worker.join(timeout=120)
    assert not worker.is_alive()
    study = client.get("/studies/cancelled").json()
    assert study["status"] == "cancelled" and study["counts"]["RUNNING"] == 0
    (trial,) = client.get("/studies/cancelled/trials").json()["items"]
    assert trial["state"] == "FAIL" and trial["fail_reason"] == "cancelled by the user"
    with sessions(settings.storage_url)() as session:
        assert session.get(TrialRecord, trial["trial_id"]).interrupted  # a resume would run it again


def test_delete_a_study_with_its_trials_and_files(service):
    client, settings = service
    launch(settings, **ONE_FAMILY, name="doomed")
    folder = Path(settings.artifact_root) / "doomed"
    trial_id = client.get("/studies/doomed/trials").json()["items"][0]["trial_id"]
    assert folder.is_dir()
    assert client.delete("/studies/doomed").status_code == 204
    assert client.get("/studies/doomed").status_code == 404
    assert client.get(f"/trials/{trial_id}").status_code == 404
    assert not folder.exists()
    assert "doomed/lstm" not in [s.study_name for s in optuna.get_all_study_summaries(settings.storage_url)]
    with sessions(settings.storage_url)() as session:
        assert session.get(TrialCountRecord, "doomed") is None
    assert client.delete("/studies/doomed").status_code == 404
    assert client.get("/studies/served").status_code == 200  # others untouched


def test_dashboard_pages_render(service):
    client, _ = service
    listing = client.get("/dashboard")
    assert listing.status_code == 200 and 'href="/dashboard/studies/served"' in listing.text
    page = client.get("/dashboard/studies/served")
    assert page.status_code == 200
    assert 'data-src="/studies/served/pareto"' in page.text
    for trial in client.get("/studies/served/trials").json()["items"]:
        assert f'href="/trials/{trial["trial_id"]}/checkpoint"' in page.text
        assert f"{trial['perplexity']:.3f}" in page.text
    assert "best possible perplexity" in page.text
    script = client.get(f"/static/{PLOTLY_JS}")
    assert script.status_code == 200 and script.text.startswith("/**\n* plotly.js (basic - minified) v")
    assert "immutable" in script.headers["cache-control"] and f'data-plotly-src="/static/{PLOTLY_JS}"' in page.text
    assert client.get("/static/vendor/..%2F..%2Fpages.py").status_code == 404  # nothing outside the folder
    assert "drawPlot" in client.get("/static/dashboard.js").text
    assert client.get("/static/missing.js").status_code == 404
    assert client.get("/dashboard/studies/absent").status_code == 404
    filtered = client.get("/dashboard/fragments/studies", params={"family": "mogrifier"}).text
    assert 'data-study="served"' in filtered and 'data-study="other"' not in filtered
    rows = client.get("/dashboard/fragments/studies/served/trials", params={"sort": "number", "family": "lstm"}).text
    assert rows.count("data-trial=") == 1 and "family=lstm&sort=number&order=desc" in rows
    trial_id = client.get("/studies/served/trials").json()["items"][0]["trial_id"]
    for path in (f"/dashboard/trials/{trial_id}", "/dashboard/studies/served/comparison",
                 "/dashboard/studies/served/sensitivity", "/dashboard/fragments/studies/served/facts"):
        assert client.get(path).status_code == 200, path
    assert client.get("/dashboard/trials/99999").status_code == 404


def test_plot_endpoints_aggregate_what_the_study_page_draws(service):
    client, _ = service
    trials = {t["family"]: t for t in client.get("/studies/served/trials").json()["items"]}
    history = client.get("/studies/served/history").json()
    assert history["unit"] == "perplexity" and history["counts"] == {"COMPLETE": 2}
    for family, trial in trials.items():
        assert history["best"][family] == {"trial_id": trial["trial_id"], "number": 0,
                                           "score": pytest.approx(trial["perplexity"])}
    lstm = trials["lstm"]["trial_id"]
    curves = client.get("/studies/served/curves", params={"trial_id": [lstm]}).json()
    assert curves["trial_ids"] == [lstm] and list(curves["averaging_switches"]) == [str(lstm)]
    valid = next(t for t in curves["figure"]["data"] if t["name"] == "lstm #0 valid")
    turns = client.get(f"/trials/{lstm}").json()["learning_curve"]
    assert valid["y"] == pytest.approx([math.exp(turn["val_loss"]) for turn in turns])
    assert len(client.get("/studies/served/curves").json()["trial_ids"]) == 2  # default: the best
    other = client.get("/studies/other/trials").json()["items"][0]["trial_id"]
    assert client.get("/studies/served/curves", params={"trial_id": [other]}).status_code == 404
    parallel = client.get("/studies/served/parallel", params={"family": "mogrifier"}).json()
    assert parallel["best_trial_id"] == parallel["neighbourhood"][0] == trials["mogrifier"]["trial_id"]
    assert parallel["figure"]["layout"]["xaxis"]["ticktext"] == ["learning_rate (log)", "mogrifier_rounds",
                                                                 "validation perplexity"]
    assert [trace["name"] for trace in parallel["figure"]["data"]] == ["best"]
    assert client.get("/studies/served/parallel", params={"family": "rlstm"}).status_code == 404
    ranked = client.get("/studies/served/importance", params={"evaluator": "ped_anova"}).json()
    assert ranked["importances"] == {"lstm": {}, "mogrifier": {}}  # one trial per family: nothing to rank
    assert client.get("/studies/served/importance", params={"evaluator": "guess"}).status_code == 422
    assert client.get("/studies/absent/history").status_code == 404


def test_trial_detail_carries_evaluations_in_the_study_unit(service):
    client, _ = service
    trial_id = client.get("/studies/served/trials").json()["items"][0]["trial_id"]
    assert client.get(f"/trials/{trial_id}").json()["evaluations"] == []  # no test protocol in this spec


def test_openapi_documents_every_endpoint(service):
    client, _ = service
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/studies", "/studies/{name}", "/studies/{name}/trials", "/studies/{name}/pareto",
            "/studies/{name}/cancel", "/trials/{trial_id}", "/trials/{trial_id}/checkpoint", "/health"} <= set(paths)
    assert {"get", "delete"} <= set(paths["/studies/{name}"]) and "post" in paths["/studies"]
    assert client.get("/docs").status_code == 200


def test_vendored_plotly_js_reads_the_figures_the_plotly_package_writes():
    # plotly (Python) writes figure JSON for the plotly.js it ships; the dashboard draws it with a vendored
    # partial bundle of plotly.js, which must be of the same major version.
    def version(header: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.search(r"v(\d+)\.(\d+)\.(\d+)", header).groups())

    shipped = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text()[:200]
    vendored = (Path(__file__).parent.parent / "dashboards" / "static" / PLOTLY_JS).read_text()[:200]
    assert version(vendored)[0] == version(shipped)[0], (shipped, vendored)
