"""`POST /studies` checks a study against its data as `POST /studies/plan` and `tuner launch` do: the vocabulary
is read (a local folder, a downloaded registered dataset), the plan's shape warnings come back with the 202, and
data that cannot be read, or a budget no model fits at that vocabulary, is refused with the plan's 422.
`POST /studies/validate` answers the same, storing nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from lm_tuner.trainers.files import CACHE_VARIABLE
from lm_tuner.tuner.settings import Settings
from tests.conftest import serve_app

SHARED_PTB = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "ptb"
YAML_BODY = {"content-type": "application/yaml"}

SILLY_PTB = {  # tied, input embedding as wide as the hidden state, a small budget: a 10,000-word embedding study
    "name": "silly-ptb",
    "dataset": {"path": str(SHARED_PTB), "format": "ptb"},
    "families": ["lstm", "mogrifier"],
    "parameter_budget": 1_100_000,
    "training": {"turns": 5, "steps_per_turn": 10, "batch_size": 16, "bptt": 35},
    "fixed": {"num_layers": 2, "input_embedding_ratio": 1.0, "tie_embeddings": True, "mogrifier_rounds": 5,
              "mogrifier_rank": 40},
    "search_space": {"learning_rate": {"low": 0.001, "high": 0.004, "log": True}},
    "tuning": {"trials": 4, "startup_trials": 2, "concurrency": 2},
}


@pytest.fixture
def client(tmp_path) -> httpx.Client:
    settings = Settings(f"sqlite:///{tmp_path / 'tuner.db'}", tmp_path / "artifacts")
    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=120) as client:
        yield client


def submit(client: httpx.Client, document: dict) -> httpx.Response:
    return client.post("/studies", content=yaml.safe_dump(document), headers=YAML_BODY)


def validate(client: httpx.Client, document: dict) -> httpx.Response:
    """POST /studies/validate, which must answer as POST /studies does, storing nothing."""
    return client.post("/studies/validate", content=yaml.safe_dump(document), headers=YAML_BODY)


def same_problems(validated: httpx.Response, refused: httpx.Response) -> bool:
    """The same fields and messages (validate also places each at its line)."""
    def problems(response: httpx.Response) -> list[tuple[str, str]]:
        return [(issue["field"], issue["message"]) for issue in response.json()["detail"]]
    return problems(validated) == problems(refused)


@pytest.mark.skipif(not SHARED_PTB.is_dir(), reason=f"no PTB files at {SHARED_PTB}")
def test_a_local_ptb_folder_with_silly_shapes_is_queued_with_the_plans_warnings(client):
    planned = client.post("/studies/plan", content=yaml.safe_dump(SILLY_PTB), headers=YAML_BODY)
    assert planned.status_code == 200, planned.text
    validated = validate(client, SILLY_PTB)
    submitted = submit(client, SILLY_PTB)
    assert submitted.status_code == 202, submitted.text
    warnings = submitted.json()["warnings"]
    assert warnings == planned.json()["warnings"]
    assert validated.status_code == 200 and validated.json() == {"name": "silly-ptb", "warnings": warnings}
    assert any("hidden size as small as" in warning for warning in warnings)
    assert any("the recurrent layers hold" in warning for warning in warnings)


@pytest.mark.skipif(not SHARED_PTB.is_dir(), reason=f"no PTB files at {SHARED_PTB}")
def test_a_budget_too_small_for_the_folders_vocabulary_is_refused(client):
    small = {**SILLY_PTB, "name": "small-ptb", "parameter_budget": 12_000}
    validated, refused = validate(client, small), submit(client, small)
    assert refused.status_code == validated.status_code == 422
    issues = refused.json()["detail"]
    assert same_problems(validated, refused)
    assert [issue["message"].split(":")[0] for issue in issues] == ["family 'lstm'", "family 'mogrifier'"]
    assert all(issue["field"] == "parameter_budget" and "vocabulary 10,000" in issue["message"] for issue in issues)
    assert client.get("/studies/small-ptb").status_code == 404


def test_a_folder_that_cannot_be_read_is_refused_as_the_plan_refuses_it(client, tmp_path):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "notes.txt").write_text("not a corpus\n")
    document = {**SILLY_PTB, "name": "garbage", "dataset": {"path": str(garbage), "format": "ptb"}}
    planned = client.post("/studies/plan", content=yaml.safe_dump(document), headers=YAML_BODY)
    validated, refused = validate(client, document), submit(client, document)
    assert refused.status_code == planned.status_code == validated.status_code == 422
    assert refused.json() == planned.json()
    assert same_problems(validated, refused)
    (issue,) = refused.json()["detail"]
    assert issue["field"] == "dataset" and "ptb.train.txt" in issue["message"]
    assert client.get("/studies/garbage").status_code == 404


def test_a_registered_dataset_not_downloaded_is_queued_with_a_warning_that_its_shapes_are_checked_later(
        client, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "empty-cache"))
    document = {**SILLY_PTB, "name": "wiki", "dataset": {"name": "wikitext-2"}}
    validated, submitted = validate(client, document), submit(client, document)
    assert submitted.status_code == 202, submitted.text
    (warning,) = submitted.json()["warnings"]
    assert validated.json() == {"name": "wiki", "warnings": [warning]}
    assert warning.startswith("dataset: 'wikitext-2' is not downloaded on this server yet")
    assert "tuner data fetch wikitext-2" in warning
    assert not (tmp_path / "empty-cache").exists()  # nothing was downloaded


def test_ptb_not_downloaded_is_queued_with_its_shapes_checked_and_a_warning_that_the_worker_downloads_it(
        client, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "empty-cache"))
    document = {**SILLY_PTB, "name": "ptb-later", "dataset": {"name": "ptb"}}
    validated, submitted = validate(client, document), submit(client, document)
    assert submitted.status_code == 202, submitted.text
    warnings = submitted.json()["warnings"]
    assert validated.json()["warnings"] == warnings
    (warning,) = [warning for warning in warnings if warning.startswith("dataset:")]
    assert warning.startswith("dataset: 'ptb' is not downloaded on this server yet; the worker downloads it when it "
                              "starts the study, which fails there if this server cannot reach it. To have it now, "
                              "on the server: `tuner data fetch ptb` downloads it from ")
    assert "`tuner data fetch ptb --from simple-examples.tgz`" in warning and "shape checks" not in warning
    over_budget = submit(client, {**document, "name": "ptb-too-small", "parameter_budget": 10_000})
    assert over_budget.status_code == 422  # the shapes are checked at PTB's known vocabulary, without the files
    assert not (tmp_path / "empty-cache").exists()  # nothing was downloaded
