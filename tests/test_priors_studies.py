"""Priors in stored and running studies, on SQLite and PostgreSQL: a study stored before `tuning.priors` existed still
relaunches; a launched study's first trials are its initial points, then the priors, and `tuner plan`, `tuner
status` (and --json) and the study page say which configuration each family starts from."""

from __future__ import annotations

import json

import httpx
import optuna
import pytest
import yaml
from sqlalchemy import select
from typer.testing import CliRunner

from lm_tuner.tuner.cli.app import app
from lm_tuner.tuner.run.controller import claim_study, launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.spec.priors import family_prior, prior_line, prior_points
from lm_tuner.tuner.store.engine import ensure_schema, sessions
from lm_tuner.tuner.store.schema import StudyRecord
from tests.conftest import TINY_SPEC, serve_app

WITH_PRIORS = {**TINY_SPEC, "tuning": {**TINY_SPEC["tuning"], "trials": 2, "priors": True,
                                       "initial_points": [{"learning_rate": 0.005}]}}


def test_a_study_stored_before_priors_existed_still_relaunches(storage_url):
    document = yaml.safe_dump(TINY_SPEC, sort_keys=False)
    spec = parse_spec(document)
    stored = spec.model_dump(mode="json")
    stored["tuning"].pop("priors", None)  # the spec as a study stored it before the field existed
    ensure_schema(storage_url)
    with sessions(storage_url).begin() as session:
        session.add(StudyRecord(name="tiny", status="cancelled", spec=stored, document=document,
                                families=",lstm,mogrifier,", submitted_via="cli"))
    claim_study(storage_url, spec, document, "cli")  # continues it: no "already exists with a different spec"
    with sessions(storage_url)() as session:
        record = session.scalar(select(StudyRecord).where(StudyRecord.name == "tiny"))
        assert (record.status, record.spec) == ("running", stored)


@pytest.mark.slow
def test_a_launched_study_starts_from_its_points_then_the_priors(ray_cluster, storage_url, tmp_path):
    document = yaml.safe_dump(WITH_PRIORS, sort_keys=False)
    spec = parse_spec(document)
    settings = Settings(storage_url, tmp_path / "artifacts")
    assert launch_study(spec, document, settings) == "complete"
    with sessions(storage_url)() as session:
        assert session.scalar(select(StudyRecord.spec).where(StudyRecord.name == "tiny"))["tuning"]["priors"] is True
    for family in spec.families:
        first, second = sorted(optuna.load_study(study_name=f"tiny/{family}", storage=storage_url).get_trials(),
                               key=lambda trial: trial.number)
        assert first.params["learning_rate"] == 0.005  # the spec's own point first (the rest sampled)
        assert second.params == prior_points(spec, family)[0]  # then the published configuration, scaled
    assert prior_points(spec, "mogrifier") == [{"learning_rate": 0.002299987130225388, "mogrifier_rounds": 4}]

    environment = {"LM_TUNER_STORAGE": storage_url, "COLUMNS": "400"}
    status = CliRunner().invoke(app, ["status", "tiny"], env=environment)
    assert status.exit_code == 0, status.output
    lines = [line for line in status.output.splitlines() if line.startswith("starts from (tuning.priors) ")]
    assert lines == [f"starts from (tuning.priors) {prior_line(family_prior(spec, family))}"
                     for family in spec.families]
    as_json = json.loads(CliRunner().invoke(app, ["status", "tiny", "--json"], env=environment).output)
    assert [prior["values"] for prior in as_json["priors"]] == [prior_points(spec, f)[0] for f in spec.families]
    assert as_json["priors"][0]["source"].startswith("deepmind/lamb@254a0b0e330c lamb/experiment/mogrifier/config/")

    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=60) as client:
        facts = client.get("/dashboard/fragments/studies/tiny/facts").text
    assert 'id="priors"' in facts
    for family in spec.families:
        assert prior_line(family_prior(spec, family)).replace("'", "&#39;") in facts


def test_the_plan_shows_each_familys_prior(tmp_path):
    document = tmp_path / "study.yaml"
    document.write_text(yaml.safe_dump({**WITH_PRIORS, "families": ["lstm", "mogrifier", "rlstm"]}))
    result = CliRunner().invoke(app, ["plan", "--space", str(document), "--no-probe", "--json"])
    assert result.exit_code == 0, result.output
    planned = {family["family"]: family["prior"] for family in json.loads(result.output)["families"]}
    assert planned["mogrifier"]["values"] == {"learning_rate": 0.002299987130225388, "mogrifier_rounds": 4}
    assert planned["rlstm"]["none_because"] == "deepmind/lamb publishes no rlstm configuration for PTB words"
    shown = CliRunner().invoke(app, ["plan", "--space", str(document), "--no-probe"], env={"COLUMNS": "400"})
    assert shown.exit_code == 0 and shown.output.count("starts from (tuning.priors)") == 3
    assert "no prior (deepmind/lamb publishes no rlstm configuration for PTB words)" in shown.output
    off = tmp_path / "off.yaml"
    off.write_text(yaml.safe_dump(TINY_SPEC))
    unplanned = json.loads(CliRunner().invoke(app, ["plan", "--space", str(off), "--no-probe", "--json"]).output)
    assert [family["prior"] for family in unplanned["families"]] == [None, None]
