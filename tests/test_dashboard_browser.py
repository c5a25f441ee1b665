"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against a uvicorn server
over a database holding a real staged study (tuning, reruns, test protocol, dynamic evaluation) and one
whose trial failed. Screenshots go to test-artifacts/dashboard/."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import update

from lm_tuner.tuner.run.controller import launch_study
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec import parse_spec
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import StudyRecord
from tests.conftest import TINY_SPEC, serve_app
from tests.test_stages import STAGED

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "dashboard"
BROKEN = {**TINY_SPEC, "name": "broken", "families": ["lstm"], "fixed": {}, "parameter_budget": 100,
          "search_space": {"learning_rate": {"low": 0.001, "high": 0.01, "log": True},
                           "num_layers": {"choices": [16]}}}  # 100 parameters cannot hold 16 layers


@pytest.fixture(scope="module")
def server(ray_cluster, tmp_path_factory) -> Iterator[tuple[str, Settings]]:
    root = tmp_path_factory.mktemp("browser")
    settings = Settings(f"sqlite:///{root / 'tuner.db'}", root / "artifacts")
    shown = {**STAGED, "name": "shown", "tuning": {"sampler": "random", "trials": 1, "concurrency": 2},
             "dynamic_evaluation": {**STAGED["dynamic_evaluation"], "trials": 1}}
    for spec, ends in ((BROKEN, "failed"), (shown, "complete")):  # a study whose every trial failed has failed
        document = yaml.safe_dump(spec, sort_keys=False)
        assert launch_study(parse_spec(document), document, settings) == ends
    with serve_app(settings) as base_url:
        yield base_url, settings


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: run `make setup` (it installs Debian's chromium) or "
                    "`apt-get install -y --no-install-recommends chromium`")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser, server, request):
    """A fresh tab on the server; fails the test on any script error; screenshot at the end."""
    base_url, _ = server
    context = browser.new_context(base_url=base_url, viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    yield tab
    shot = ARTIFACTS / f"{request.node.name}.png"
    tab.screenshot(path=shot, full_page=True)
    print(f"screenshot: {shot}")
    context.close()
    assert errors == []


@pytest.fixture
def api(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server[0], timeout=60) as client:
        yield client


def open_page(page, path: str) -> None:
    page.goto(path)
    page.wait_for_selector("body[data-ready=true]", timeout=30_000)


def traces(page, plot: str) -> dict[str, dict]:
    """The traces plotly.js holds for a plot, by name (what is drawn, not what was sent)."""
    return page.evaluate(f"""() => Object.fromEntries(document.getElementById("{plot}").data.map(
        (t, i) => [t.name || String(i), {{x: t.x, y: t.y, type: t.type, customdata: t.customdata}}]))""")


def test_studies_page_shows_status_progress_best_and_filters(page, api):
    open_page(page, "/dashboard")
    rows = page.locator("#studies tbody tr")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.study)")) == ["broken", "shown"]
    shown = api.get("/studies/shown").json()
    row = page.locator("tr[data-study=shown]")
    assert f"{shown['best_perplexity']:.3f} perplexity" in row.inner_text()
    assert shown["trials_finished"] == shown["trials_expected"] == 8  # 2 tuning, 4 reruns, 2 dynamic evaluation
    assert "lstm, mogrifier" in row.inner_text() and "8,000" in row.inner_text() and "8 / 8" in row.inner_text()
    assert row.locator("progress.progress").get_attribute("value") == "1.0"
    assert row.locator("a[href='/dashboard/studies/shown/comparison']").count() == 1  # a comparison
    assert "1 failed" in page.locator("tr[data-study=broken]").inner_text()
    page.select_option("form.filters select[name=family]", "mogrifier")
    page.wait_for_function("() => document.querySelectorAll('#studies tbody tr').length === 1")
    assert page.locator("#studies tbody tr").get_attribute("data-study") == "shown"


def test_study_page_plots_hold_the_study(page, api):
    open_page(page, "/dashboard/studies/shown")
    # plotly.js's own rules come from its stylesheet (the page's policy forbids the <style> it would add)
    assert page.evaluate("getComputedStyle(document.querySelector('#history .main-svg')).position") == "absolute"
    tuned = api.get("/studies/shown/trials", params={"stage": "tune"}).json()["items"]
    history = traces(page, "history")
    for trial in tuned:
        assert history[trial["family"]]["y"] == pytest.approx([trial["perplexity"]])
        assert history[f"{trial['family']} best so far"]["y"][-1] == pytest.approx(trial["perplexity"])
    pareto = traces(page, "pareto")
    assert {"lstm", "mogrifier", "non-dominated"} <= set(pareto)
    best_two = sorted(tuned, key=lambda t: t["value"])
    curves = traces(page, "curves")
    assert {f"{t['family']} #{t['number']} valid" for t in best_two} <= set(curves)
    detail = api.get(f"/trials/{best_two[0]['trial_id']}").json()
    expected = [pytest.approx(2.718281828459045 ** turn["val_loss"]) for turn in detail["learning_curve"]]
    assert curves[f"{best_two[0]['family']} #{best_two[0]['number']} valid"]["y"] == expected
    parallel = traces(page, "parallel")
    assert page.evaluate("document.getElementById('parallel').layout.xaxis.ticktext")[-1] == "validation perplexity"
    assert list(parallel) == ["best"] and parallel["best"]["type"] == "scatter"  # one complete trial per family
    assert len({trial_id for trial_id, _ in parallel["best"]["customdata"]}) == 1
    ranked = api.get("/studies/shown/importance").json()["importances"]
    assert {name: trace["y"] for name, trace in traces(page, "importance").items()} == {
        family: sorted(values, key=values.get) for family, values in ranked.items()}
    assert page.locator("#facts #best").inner_text().startswith(f"{min(t['perplexity'] for t in tuned):.3f}")


def test_trial_table_sorts_and_filters_on_the_server_without_reloading(page, api):
    open_page(page, "/dashboard/studies/shown")
    page.evaluate("window.stillHere = true")
    total = api.get("/studies/shown/trials").json()["total"]
    assert page.locator("#trials-table tbody tr").count() == total
    page.click("#trials-table th a:text('trial')")
    page.wait_for_selector("#trials-table th a:text('trial ▲')")
    ordered = api.get("/studies/shown/trials", params={"sort": "number"}).json()["items"]
    rows = page.locator("#trials-table tbody tr").evaluate_all("rs => rs.map(r => Number(r.dataset.trial))")
    assert rows == [t["trial_id"] for t in ordered]
    page.select_option("form.filters select[name=stage]", "rerun")
    page.wait_for_function("() => document.querySelectorAll('#trials-table tbody tr').length === 4")
    assert {text.split()[0] for text in page.locator("#trials-table tbody td:nth-child(4)").all_inner_texts()} == {
        "rerun"}
    box = page.locator("#trials-table input[data-curve]").first
    chosen = box.get_attribute("value")
    box.check()
    page.wait_for_function(f"() => document.getElementById('curves').dataset.src.endsWith('trial_id={chosen}')")
    page.wait_for_function("() => document.getElementById('curves').data.length >= 2 && "
                           "document.getElementById('curves').data[0].name.includes('(rerun)')")
    assert page.evaluate("window.stillHere") is True


def test_click_from_the_list_to_a_trial_and_download_its_checkpoint(page, api, tmp_path):
    open_page(page, "/dashboard")
    page.click("a[href='/dashboard/studies/shown']")
    page.wait_for_selector("body[data-ready=true]")
    first = page.locator("#trials-table tbody tr", has=page.locator("td:nth-child(4)", has_text="tune")).first
    trial_id = int(first.get_attribute("data-trial"))
    first.locator("td:nth-child(2) a").click()
    page.wait_for_url(f"**/dashboard/trials/{trial_id}")
    page.wait_for_selector("body[data-ready=true]")
    detail = api.get(f"/trials/{trial_id}").json()
    shown = page.locator("#params").inner_text()
    for name, value in detail["params"].items():
        assert f"{name}\t{value:.6g}" in shown
    assert page.locator("#score").inner_text() == f"{detail['perplexity']:.3f}"
    assert len(traces(page, "curve")) >= 2  # validation and training
    with page.expect_download() as download_info:
        page.click("#checkpoint")
    saved = tmp_path / "best.pt"
    download_info.value.save_as(saved)
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == detail["checkpoint"]["sha256"]


def test_trial_page_shows_evaluations_of_a_final_model(page, api):
    table = api.get("/studies/shown/comparison").json()
    rerun = table["families"][0]["final_trial_ids"][0]
    open_page(page, f"/dashboard/trials/{rerun}")
    detail = api.get(f"/trials/{rerun}").json()
    kinds = page.locator("#evaluations tbody tr").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert kinds == [e["kind"] for e in detail["evaluations"]] and "deterministic" in kinds
    for evaluation in detail["evaluations"]:
        assert f"{evaluation['test_score']:.3f}" in page.locator(f"#evaluations tr[data-kind={evaluation['kind']}]"
                                                                 ).inner_text()
    assert f"/dashboard/trials/{detail['parent_trial_id']}" in page.content()


def test_comparison_page_table_pareto_and_lineage(page, api):
    open_page(page, "/dashboard/studies/shown/comparison")
    table = api.get("/studies/shown/comparison").json()
    for family in table["families"]:
        row = page.locator(f"#results tr[data-family={family['family']}]").inner_text()
        for key in ("valid", "test", "mc_valid", "mc_test", "dynamic_valid", "dynamic_test"):
            estimate = family[key]
            assert f"{estimate['mean']:.3f}" in row
            if estimate["count"] > 1:
                assert f"± {estimate['std']:.3f}" in row
        for link in family["lineage"]:
            assert page.locator(f"#lineage a[href='/dashboard/trials/{link['dyneval_trial_id']}']").count() == 1
            assert page.locator(f"#lineage a[href='/trials/{link['checkpoint_trial_id']}/checkpoint']").count() == 1
    if table["winner"]:  # named only where the seeds separate it (2 seeds each here)
        assert page.locator("#winner").inner_text() == table["winner"]
        assert f"ahead of {table['margin']['runner_up']} by" in page.locator("#margin").inner_text()
    else:
        assert page.locator("#verdict").inner_text() == table["verdict"]
    assert page.locator("#budget-verdict").inner_text() == table["budget_verdict"]
    assert {"lstm", "mogrifier", "non-dominated"} <= set(traces(page, "pareto"))
    assert page.evaluate("document.getElementById('pareto').layout.xaxis.title.text") == "compute (CPU core-seconds)"
    budget = traces(page, "budget-curves")
    assert any(name.startswith("lstm (") and "tokens per core-second" in name for name in budget)
    page.select_option("select[data-plot=pareto]", "gpu_seconds")
    page.wait_for_function("() => document.getElementById('pareto').layout.xaxis.title.text.startsWith('GPU')")


def test_failed_trials_are_visible_and_distinguishable(page, api):
    open_page(page, "/dashboard/studies/broken")
    (failed,) = api.get("/studies/broken/trials").json()["items"]
    history = traces(page, "history")
    assert history["lstm failed"]["x"] == [failed["number"]]
    row = page.locator(f"#trials-table tr[data-trial='{failed['trial_id']}']")
    assert row.get_attribute("class") == "state-row-FAIL" and "too small" in row.inner_text()


def test_pages_refresh_in_place_while_a_study_runs(page, server):
    _, settings = server
    set_status(settings, "shown", "running")
    try:
        open_page(page, "/dashboard/studies/shown?refresh=0.3")
        page.evaluate("window.stillHere = true")
        page.wait_for_function("() => Number(document.getElementById('history').dataset.loads) >= 2")  # refreshed
        assert page.evaluate("document.body.dataset.live") == "true"
        set_status(settings, "shown", "complete")
        page.wait_for_selector("#facts [data-status=complete]")
    finally:
        set_status(settings, "shown", "complete")
    page.wait_for_selector("body[data-live=false]")
    refreshes = page.evaluate("Number(document.body.dataset.refreshes)")
    page.wait_for_timeout(1000)
    assert page.evaluate("Number(document.body.dataset.refreshes)") == refreshes  # stopped once it ended
    assert page.evaluate("window.stillHere") is True  # never reloaded


def set_status(settings: Settings, name: str, status: str) -> None:
    with sessions(settings.storage_url).begin() as session:
        session.execute(update(StudyRecord).where(StudyRecord.name == name).values(status=status))
