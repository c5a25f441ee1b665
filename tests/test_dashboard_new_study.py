"""The "New study" page in Debian's headless Chromium against a served API with a worker: a shipped space loaded
into the editor, a broken line flagged at that line, a plan, a submitted study whose first trial appears, cancelled
and resumed from its page; a visitor without a token is asked to sign in and cannot submit. Then the REST
endpoints under the page: POST /studies/validate and POST /studies/{name}/resume."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest
import yaml

from lm_tuner.api.submission_checks import data_checks
from lm_tuner.tuner.run.queue import run_worker, submit_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import SpecError, parse_spec
from lm_tuner.tuner.spec.shipped import shipped_space
from lm_tuner.tuner.store.engine import ensure_schema
from lm_tuner.tuner.store.tokens import create_token
from tests.conftest import TINY_SPEC, serve_app
from tests.test_dashboard_browser import ARTIFACTS, browser  # noqa: F401  (the module's Chromium, as a fixture)

pytestmark = pytest.mark.slow

ONE_FAMILY = {**TINY_SPEC, "families": ["lstm"], "fixed": {"num_layers": 1},
              "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True}}}
# Long turns: the first trial is still running when the test cancels the study.
SLOW = {**ONE_FAMILY, "name": "from-the-browser", "training": {**TINY_SPEC["training"], "steps_per_turn": 3000},
        "tuning": {"sampler": "random", "trials": 3, "concurrency": 1}}
SPACE = "small/lstm_ptb"


@pytest.fixture(scope="module")
def served(ray_cluster, tmp_path_factory) -> Iterator[tuple[str, Settings]]:
    """The API and a worker thread, as `tuner serve` runs them, over an empty database (authentication off)."""
    root = tmp_path_factory.mktemp("new_study")
    settings = Settings(f"sqlite:///{root / 'tuner.db'}", root / "artifacts")
    ensure_schema(settings.storage_url)
    stop = threading.Event()
    worker = threading.Thread(target=run_worker, args=(settings,), kwargs={"poll_seconds": 0.5, "stop": stop})
    worker.start()
    with serve_app(settings) as base_url:
        yield base_url, settings
    stop.set()
    worker.join(timeout=120)


@pytest.fixture(scope="module")
def quiet(tmp_path_factory) -> Iterator[tuple[httpx.Client, Settings]]:
    """The API alone: studies it queues stay queued until a test runs a worker."""
    root = tmp_path_factory.mktemp("quiet")
    settings = Settings(f"sqlite:///{root / 'tuner.db'}", root / "artifacts")
    with serve_app(settings) as base_url, httpx.Client(base_url=base_url, timeout=120) as client:
        yield client, settings


@pytest.fixture
def api(served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[0], timeout=120) as client:
        yield client


def open_tab(browser, base_url: str, errors: list[str]):  # noqa: F811
    context = browser.new_context(base_url=base_url, viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    tab.on("pageerror", lambda error: errors.append(str(error)))
    # A refused request (the 401 below) is logged by Chromium itself; script errors are what fails a test.
    tab.on("console", lambda m: errors.append(m.text) if m.type == "error" and "Failed to load" not in m.text else None)
    return context, tab


def editor_line(tab, number: int):
    """The rendered line `number` (1-based) of the editor: its gutter and its text."""
    return tab.locator(".CodeMirror-code > div", has=tab.locator(f".CodeMirror-linenumber:text-is('{number}')"))


def test_write_plan_submit_cancel_and_resume_a_study(browser, served, api):  # noqa: F811
    base_url, _ = served
    errors: list[str] = []
    context, tab = open_tab(browser, base_url, errors)
    tab.goto("/dashboard")
    tab.click("a#new-study")
    tab.wait_for_url(f"{base_url}/dashboard/studies/new")
    tab.select_option("#space", SPACE)
    tab.wait_for_function(f"() => document.body.dataset.space === '{SPACE}'")
    editor = "document.querySelector('.CodeMirror').CodeMirror"
    assert tab.evaluate(f"{editor}.getValue()") == shipped_space(SPACE).text
    tab.wait_for_selector("#issues[data-state=valid]")

    # Break one line by typing into it: the CLI's message appears at that line, and nowhere else.
    lines = shipped_space(SPACE).text.splitlines()
    broken = next(i for i, line in enumerate(lines, 1) if line.startswith("parameter_budget:"))
    value_end = len(lines[broken - 1].split("#")[0].rstrip())  # before the line's comment (its source)
    tab.evaluate(f"{editor}.setCursor({{line: {broken - 1}, ch: {value_end}}})")
    tab.locator(".CodeMirror textarea").focus()
    tab.keyboard.type(" thousand")
    tab.wait_for_selector("#issues[data-state=invalid]")
    cli_issue = _issues(tab.evaluate(f"{editor}.getValue()"))
    assert [(i.field, i.line) for i in cli_issue] == [("parameter_budget", broken)]
    (item,) = tab.locator("#issues li").all()
    assert item.get_attribute("data-line") == str(broken)
    assert item.inner_text() == f"line {broken}: parameter_budget: {cli_issue[0].message}"
    assert editor_line(tab, broken).locator(".CodeMirror-lint-marker-error").count() == 1
    assert tab.locator(".CodeMirror-lint-marker-error").count() == 1
    tab.screenshot(path=str(ARTIFACTS / "new_study_error.png"), full_page=True)
    tab.keyboard.press("Control+z")
    assert tab.evaluate(f"{editor}.getValue()") == shipped_space(SPACE).text
    tab.wait_for_selector("#issues[data-state=valid]")

    # Plan a tiny study, with the probe: shapes, parameter split, time estimate, warnings.
    tab.evaluate(f"{editor}.setValue({json.dumps(yaml.safe_dump(SLOW, sort_keys=False))})")
    tab.wait_for_selector("#issues[data-state=valid]")
    tab.click("#plan")
    tab.wait_for_selector("#plan-output[data-state='200']", timeout=120_000)
    planned = api.post("/studies/plan", content=yaml.safe_dump(SLOW)).json()  # the same plan, without the probe
    (family,) = planned["families"]
    table = tab.locator("#plan-output table[data-family=lstm]").inner_text()
    hidden = family["hidden_size"]
    assert f"hidden size min / median / max\t{hidden['min']:,} / {hidden['median']:,} / {hidden['max']:,}" in table
    assert f"total parameters\t{family['parameters']['total']:,}" in table and "time per trial" in table
    assert tab.locator("#plan-estimate").inner_text().startswith("study: 3 runs, about ")
    cost = tab.locator("#plan-cost").inner_text()  # the whole study, timed by the probe on this server
    assert cost.startswith("cost: about ") and " core-hours: " in cost and cost.endswith("(timed here by the probe)")
    shown = tab.locator("#plan-warnings li").all_inner_texts()  # the probe may add one: evaluation's share
    assert {f"warning: {w}" for w in planned["warnings"]} <= set(shown)
    assert api.get("/studies").json()["total"] == 0  # planning created nothing
    tab.screenshot(path=str(ARTIFACTS / "new_study_plan.png"), full_page=True)

    # Submit: the study's page opens, its first trial appears, Cancel stops it, Resume queues it again.
    tab.click("#submit")
    tab.wait_for_url(f"{base_url}/dashboard/studies/from-the-browser")
    tab.wait_for_selector("#trials tbody tr[data-trial]", timeout=120_000)
    tab.wait_for_selector("#study-actions button[data-action=cancel]:enabled")
    assert tab.locator("#study-actions button[data-action=resume]").is_disabled()
    tab.click("#study-actions button[data-action=cancel]")
    tab.wait_for_selector("#facts [data-status=cancelled]", timeout=120_000)
    assert api.get("/studies/from-the-browser").json()["status"] == "cancelled"
    tab.click("#study-actions button[data-action=resume]:enabled")
    tab.wait_for_selector("#facts [data-status=running]", timeout=120_000)  # the worker took it again
    tab.click("#study-actions button[data-action=cancel]:enabled")
    tab.wait_for_selector("#facts [data-status=cancelled]", timeout=120_000)
    tab.screenshot(path=str(ARTIFACTS / "new_study_cancelled.png"), full_page=True)
    context.close()
    assert errors == []


def _issues(document: str):
    with pytest.raises(SpecError) as raised:
        parse_spec(document)
    return raised.value.issues


def test_without_a_token_the_page_asks_to_sign_in_and_cannot_submit(browser, tmp_path):  # noqa: F811
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    ensure_schema(url)
    token = create_token(url, "browser")  # authentication on; reads stay public
    errors: list[str] = []
    with serve_app(Settings(url, tmp_path / "artifacts")) as base_url:
        context, tab = open_tab(browser, base_url, errors)
        tab.goto("/dashboard/studies/new")
        prompt = tab.get_by_role("alert")
        assert "need an API token" in prompt.inner_text()
        assert prompt.locator("a").get_attribute("href") == "/dashboard/sign-in?next=/dashboard/studies/new"
        assert tab.locator("#submit").is_disabled() and tab.locator("#plan").is_disabled()
        tab.wait_for_selector("#issues[data-state=valid]")  # checking needs no token
        refused = tab.evaluate("""async () => (await fetch("/studies", {method: "POST", body:
            document.querySelector(".CodeMirror").CodeMirror.getValue(),
            headers: {"Content-Type": "application/yaml"}})).status""")
        assert refused == 401
        assert httpx.get(f"{base_url}/studies", timeout=30).json()["total"] == 0
        tab.screenshot(path=str(ARTIFACTS / "new_study_signed_out.png"), full_page=True)

        prompt.locator("a").click()
        tab.fill("input[name=token]", token)
        tab.click("form.sign-in button")
        tab.wait_for_url(f"{base_url}/dashboard/studies/new")
        assert tab.get_by_role("alert").count() == 0 and tab.locator("#submit").is_enabled()
        context.close()
    assert errors == []


def test_validate_lists_every_problem_at_its_line_and_creates_nothing(quiet):
    api, settings = quiet
    text = shipped_space(SPACE).text
    assert api.post("/studies/validate", content=text).json() == {"name": "small-lstm-ptb",
                                                                 "warnings": data_checks(parse_spec(text))[1]}
    broken = text.replace("families: [lstm]", "families: [lstm, nope]").replace("\n  batch_size: 8",
                                                                                "\n  batch_size: -1")
    lines = broken.splitlines()
    expected = [{"field": i.field, "message": i.message, "line": i.line} for i in _issues(broken)]
    found = api.post("/studies/validate", content=broken)
    assert found.status_code == 422 and found.json() == {"detail": expected} and len(expected) == 2
    assert {lines[i["line"] - 1].split(":")[0].strip() for i in expected} == {"families", "batch_size"}
    # What only POST /studies refuses (the budget, a taken name) is placed at its line too.
    tight = text.replace("parameter_budget: ", "parameter_budget: 10 #")
    (budget,) = api.post("/studies/validate", content=tight).json()["detail"]
    assert budget["field"] == "parameter_budget" and "too small" in budget["message"]
    assert tight.splitlines()[budget["line"] - 1].startswith("parameter_budget:")
    assert api.get("/studies").json()["total"] == 0
    taken = json.dumps({**ONE_FAMILY, "name": "taken"})
    assert api.post("/studies/validate", content=taken).status_code == 200
    assert api.post("/studies/validate").json()["detail"][0]["message"].startswith("the document must be a mapping")
    submit_study(settings.storage_url, parse_spec(taken), taken)
    api.post("/studies/taken/cancel")  # not for the worker of the test below
    assert api.post("/studies/validate", content=taken).json()["detail"] == [
        {"field": "name", "message": "a study named 'taken' already exists; choose another name", "line": 1}]


def test_resume_queues_a_cancelled_study_which_the_worker_finishes(ray_cluster, quiet):
    api, settings = quiet
    spec = {**ONE_FAMILY, "name": "resumed", "tuning": {"sampler": "random", "trials": 2, "concurrency": 1}}
    assert api.post("/studies/absent/resume").status_code == 404
    assert api.post("/studies", content=json.dumps(spec)).status_code == 202
    assert api.post("/studies/resumed/cancel").json()["status"] == "cancelled"
    assert api.post("/studies/resumed/resume").json() == {"name": "resumed", "status": "queued"}
    refused = api.post("/studies/resumed/resume")
    assert refused.status_code == 409
    assert refused.json()["detail"] == "study 'resumed' is queued; only failed or cancelled studies can be resumed"
    assert run_worker(settings, once=True) == 1
    study = api.get("/studies/resumed").json()
    assert study["counts"]["COMPLETE"] == 2 and study["error"] is None
    assert api.post("/studies/resumed/resume").json()["detail"] == (
        "study 'resumed' is complete; only failed or cancelled studies can be resumed")


def test_resume_needs_a_token_when_authentication_is_on(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    ensure_schema(url)
    submit_study(url, parse_spec(json.dumps({**ONE_FAMILY, "name": "guarded"})), "{}")
    token = create_token(url, "resumer")
    with serve_app(Settings(url, tmp_path / "artifacts")) as base_url, httpx.Client(base_url=base_url) as client:
        assert client.post("/studies/guarded/resume").status_code == 401
        headers = {"Authorization": f"Bearer {token}"}
        assert client.post("/studies/guarded/cancel", headers=headers).status_code == 202
        assert client.post("/studies/guarded/resume", headers=headers).json()["status"] == "queued"

