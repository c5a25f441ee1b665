"""optuna-dashboard opens our database and sees the same trials our API serves."""

from __future__ import annotations

import httpx
import pytest
import yaml
from optuna_dashboard import wsgi

from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import optuna_storage
from tests.conftest import TINY_SPEC, serve_app

pytestmark = pytest.mark.slow


def test_optuna_dashboard_reads_the_same_trials(ray_cluster, storage_url, tmp_path):
    settings = Settings(storage_url, tmp_path / "artifacts")
    document = yaml.safe_dump({**TINY_SPEC, "name": "shared"})
    assert launch_study(parse_spec(document), document, settings) == "complete"
    dashboard = httpx.Client(transport=httpx.WSGITransport(app=wsgi(optuna_storage(storage_url))),
                             base_url="http://optuna-dashboard")
    summaries = {s["study_name"]: s for s in dashboard.get("/api/studies").json()["study_summaries"]}
    assert set(summaries) == {"shared/lstm", "shared/mogrifier"}

    with serve_app(settings) as base_url:
        ours = {t["trial_id"]: t for t in httpx.get(f"{base_url}/studies/shared/trials").json()["items"]}
    seen = {}
    for summary in summaries.values():
        detail = dashboard.get(f"/api/studies/{summary['study_id']}").json()
        for trial in detail["trials"]:
            seen[trial["trial_id"]] = trial
    assert set(seen) == set(ours)
    for trial_id, theirs in seen.items():
        mine = ours[trial_id]
        assert theirs["state"].upper() == mine["state"]
        assert theirs["values"] == [pytest.approx(mine["value"])]
        assert {p["name"]: float(p["param_external_value"]) for p in theirs["params"]} == \
            pytest.approx(mine["params"])
        user_attrs = {a["key"]: a["value"] for a in theirs["user_attrs"]}
        assert user_attrs["family"] == mine["family"]
        assert int(user_attrs["parameter_count"]) == mine["parameter_count"]
        assert len(theirs["intermediate_values"]) == mine["turns_reported"]
