"""Measured sensitivity: the moved values, then real re-runs requested from the CLI and over REST."""

from __future__ import annotations

import math
import subprocess
import sys

import httpx
import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from lm_tuner.tuner.analysis.sensitivity import sensitivity_runs
from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.run.queue import run_worker
from lm_tuner.tuner.run.sensitivity import SensitivityError, moved_values, plan_sensitivity
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.space import rerun_seed
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import TrialRecord
from tests.conftest import TINY_SPEC, serve_app
from tests.test_cli import tuner


def test_moved_values_span_fifteen_percent_of_the_range_around_the_best():
    assert moved_values(FloatDistribution(0.0, 1.0), 0.5, 5) == pytest.approx([0.35, 0.425, 0.5, 0.575, 0.65])
    assert moved_values(FloatDistribution(0.0, 1.0), 0.95, 3) == pytest.approx([0.8, 0.95, 1.0])  # clipped
    logged = moved_values(FloatDistribution(1e-4, 1e-2, log=True), 1e-3, 3)  # 2 decades: ±0.3 decade
    assert [math.log10(v) for v in logged] == pytest.approx([-3.3, -3.0, -2.7])
    assert moved_values(IntDistribution(1, 10), 5, 5) == [4, 5, 6]  # rounded, duplicates dropped
    with pytest.raises(SensitivityError, match="categorical"):
        moved_values(CategoricalDistribution(["a", "b"]), "a", 3)


def test_cli_help_explains_the_action():
    result = subprocess.run([sys.executable, "-m", "lm_tuner.tuner",
                             "sensitivity", "--help"], capture_output=True, text=True,
                            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert result.returncode == 0
    for phrase in ("--parameter", "--seeds", "--points", "±15%", "mean ± std"):
        assert phrase in result.stdout


@pytest.fixture(scope="module")
def tuned(ray_cluster, tmp_path_factory) -> Settings:
    root = tmp_path_factory.mktemp("sensitivity")
    settings = Settings(f"sqlite:///{root / 'tuner.db'}", root / "artifacts")
    document = yaml.safe_dump({**TINY_SPEC, "name": "moved", "families": ["lstm"], "fixed": {"num_layers": 1},
                               "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}},
                               "tuning": {"sampler": "random", "trials": 1, "concurrency": 2}})
    assert launch_study(parse_spec(document), document, settings) == "complete"
    return settings


@pytest.mark.slow
def test_cli_reruns_the_best_with_the_parameter_moved_and_reports_the_effect(tuned, tmp_path):
    url = tuned.storage_url
    arguments = ["moved", "--parameter", "learning_rate", "--seeds", "2", "--points", "2",
                 "--storage", url, "--artifacts", str(tuned.artifact_root)]
    result = tuner("sensitivity", *arguments, cwd=tmp_path)  # as a user runs it: in this process its exit
    # would shut down the tests' Ray and take over their signal handlers
    assert result.returncode == 0, result.stderr
    assert "4 new run(s)" in result.stdout
    runs = sensitivity_runs(url, "moved", "learning_rate")
    assert len(runs) == 4 and set(runs["state"]) == {"COMPLETE"}
    with sessions(url)() as session:
        best = session.query(TrialRecord).filter_by(stage="tune").one()
        records = session.query(TrialRecord).filter_by(stage="sensitivity").all()
    best_rate = optuna.storages.RDBStorage(url).get_trial(best.trial_id).params["learning_rate"]
    expected = [best_rate * 10 ** -0.15, best_rate * 10 ** 0.15]  # one decade searched: ±0.15 decade
    assert sorted(set(runs["value"])) == pytest.approx(expected)
    assert {r.parent_trial_id for r in records} == {best.trial_id}
    assert sorted({r.seed for r in records}) == [rerun_seed(parse_spec(yaml.safe_dump(TINY_SPEC)), i)
                                                 for i in range(2)]
    for line, value in zip(sorted(line for line in result.stdout.splitlines() if "│ 0.0" in line), expected,
                           strict=True):
        assert f"{value:.4g}" in line and "│ 2 " in line
    again = tuner("sensitivity", *arguments, cwd=tmp_path)
    assert again.returncode == 0 and "0 new run(s)" in again.stdout  # nothing is run twice
    refused = tuner("sensitivity", arguments[0], "--parameter", "num_layers", *arguments[3:], cwd=tmp_path)
    assert refused.returncode == 2 and "allowed: a hyperparameter searched for lstm (learning_rate)" in refused.stderr
    endless = tuner("sensitivity", *arguments[:5], "--points", "1000000", *arguments[7:], cwd=tmp_path)
    assert endless.returncode == 2 and "points: got 1000000; allowed: 2 to 21" in endless.stderr  # before a run


@pytest.mark.parametrize(("seeds", "points", "refused"), [(0, 5, "seeds: got 0; allowed: 1 to 20"),
                                                          (21, 5, "seeds: got 21; allowed: 1 to 20"),
                                                          (1, 22, "points: got 22; allowed: 2 to 21")])
def test_a_request_beyond_the_limits_queues_nothing(tuned, seeds, points, refused):
    before = len(sensitivity_runs(tuned.storage_url, "moved", "learning_rate"))
    with pytest.raises(SensitivityError, match=refused):
        plan_sensitivity(tuned.storage_url, "moved", "learning_rate", seeds=seeds, points=points)
    assert len(sensitivity_runs(tuned.storage_url, "moved", "learning_rate")) == before


@pytest.mark.slow
def test_rest_request_is_queued_run_by_a_worker_and_plotted(tuned, tmp_path):
    # a service and a worker given other stores than the study's: the runs go to the study's
    service_store, worker_store = tmp_path / "service-store", tmp_path / "worker-store"
    with serve_app(Settings(tuned.storage_url, service_store)) as base_url, \
            httpx.Client(base_url=base_url, timeout=60) as client:
        refused = client.post("/studies/moved/sensitivity", json={"parameter": "learning_rate", "family": "rlstm"})
        (issue,) = refused.json()["detail"]
        assert refused.status_code == 422 and issue["loc"] == ["body", "family"]
        assert issue["msg"] == "family: got 'rlstm'; allowed: lstm"
        assert client.post("/studies/absent/sensitivity", json={"parameter": "learning_rate"}).status_code == 404
        plan = client.post("/studies/moved/sensitivity", json={"parameter": "learning_rate", "seeds": 1, "points": 3})
        assert plan.status_code == 202
        body = plan.json()
        assert len(body["values"]) == 3 and body["values"][1] == pytest.approx(body["best_value"])
        assert body["queued"] == 1 + 0  # the two outer values were measured with seed 0 already by the CLI test
        assert client.get("/studies/moved/sensitivity", params={"parameter": "learning_rate"}).json()["pending"] == 1

        run_worker(Settings(tuned.storage_url, worker_store), once=True)
        assert not any(store.exists() and any(store.rglob("*.pt")) for store in (service_store, worker_store))
        assert len(list((tuned.artifact_root / "moved" / "lstm" / "sensitivity").glob("trial-*/best.pt"))) == 5

        effect = client.get("/studies/moved/sensitivity", params={"parameter": "learning_rate"}).json()
        assert effect["pending"] == 0 and effect["unit"] == "perplexity"
        counts = {round(point["value"], 12): point["count"] for point in effect["effect"]}
        assert counts[round(body["best_value"], 12)] == 1
        traces = {trace["name"]: trace for trace in effect["figure"]["data"]}
        assert traces["lstm mean ± std"]["y"] == pytest.approx([p["mean"] for p in effect["effect"]])
        assert traces["best configuration"]["x"] == pytest.approx([body["best_value"]] * 2)
        page = client.get("/dashboard/studies/moved/sensitivity", params={"parameter": "learning_rate"})
        assert page.status_code == 200 and f"{effect['effect'][0]['mean']:.3f}" in page.text
