"""The study page's figures can be read, in Debian's headless Chromium, for studies of 0, 1, 3 and 12 trials
written to the database directly (no training): words instead of empty axes, the open band at n = 1 shown, bands
within their axes and without stray markers, whole-number ticks for counts, running trials' learning curves."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import TrialRecord, TurnRecord
from tests.conftest import serve_app
from tests.test_dashboard_browser import ARTIFACTS, browser  # noqa: F401  (the module's Chromium, as a fixture)
from tests.test_progress import add_study, add_trial
from tests.test_reports import TWO_FAMILIES

pytestmark = pytest.mark.slow

PLOTS = ("history", "pareto", "tuning-curves", "curves", "parallel", "importance")
COUNTED = ("history", "tuning-curves", "curves")  # x-axes of counts: trial number, n, turn


def add_figure_study(url: str, name: str, complete: int, running: int = 0) -> None:
    """A two-family study with `complete` tuning trials (3 turns each) and `running` ones at turn 9."""
    add_study(url, name, status="running" if running or not complete else "complete", **TWO_FAMILIES,
              tuning={"trials": max(complete + running, 2), "concurrency": 2})
    rng = np.random.default_rng(complete)
    for index in range(complete + running):
        state = "COMPLETE" if index < complete else "RUNNING"
        trial_id = add_trial(url, name, "tune", state, family=("lstm", "mogrifier")[index % 2],
                             params={"learning_rate": float(rng.uniform(0.1, 0.9))})
        turns = 3 if state == "COMPLETE" else 9
        losses = 4.9 - 0.05 * np.arange(turns) + rng.normal(0.0, 0.05)
        with sessions(url).begin() as session:
            record = session.get(TrialRecord, trial_id)
            record.value = float(losses.min()) if state == "COMPLETE" else None
            record.turns_reported = turns
            session.add_all(TurnRecord(trial_id=trial_id, turn=turn + 1, step=4 * (turn + 1),
                                       train_loss=float(loss) + 0.1, val_loss=float(loss),
                                       best_val_loss=float(losses[:turn + 1].min()), tokens_per_second=1000.0,
                                       wall_seconds=float(turn + 1)) for turn, loss in enumerate(losses))


@pytest.fixture(scope="module")
def base_url(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("figures")
    url = f"sqlite:///{root / 'tuner.db'}"
    add_figure_study(url, "zero", 0)
    add_figure_study(url, "one", 1)
    add_figure_study(url, "three", 3, running=2)
    add_figure_study(url, "twelve", 12)
    with serve_app(Settings(url, root / "artifacts")) as served:
        yield served


@pytest.fixture
def page(browser, base_url, request):  # noqa: F811
    context = browser.new_context(base_url=base_url, viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    yield tab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=ARTIFACTS / f"figures_{request.node.name}.png", full_page=True)
    context.close()
    assert errors == []


def open_study(page, name: str) -> None:
    page.goto(f"/dashboard/studies/{name}?refresh=3600")
    page.wait_for_selector("body[data-ready=true]", timeout=60_000)


def shown_words(page, plot: str) -> str:
    """The text plotly drew as annotations in a plot (its empty state, a tuning curve's verdict)."""
    return " ".join(page.locator(f"#{plot} .annotation-text").all_text_contents())


def x_tick_labels(page, plot: str) -> list[float]:
    texts = page.locator(f"#{plot} .xtick text").all_text_contents()
    return [float(text.replace("\u2212", "-").replace(",", "")) for text in texts]


def test_a_study_without_trials_says_so_in_every_plot(page):
    open_study(page, "zero")
    for plot in PLOTS:
        assert page.evaluate(f"document.getElementById('{plot}')._fullLayout.xaxis.visible") is False, plot
        assert page.locator(f"#{plot} .xtick").count() == 0, plot  # no axes from -1 to 4
    assert shown_words(page, "history") == "No tuning trial has finished yet."
    assert shown_words(page, "pareto") == "Nothing to draw yet."
    assert shown_words(page, "tuning-curves").startswith("No complete tuning trial yet")
    assert shown_words(page, "curves") == "No trial has reported a turn yet."
    assert shown_words(page, "parallel") == "No complete lstm trial yet."
    assert shown_words(page, "importance").startswith("Importance needs two complete tuning trials")


@pytest.mark.parametrize("name", ["one", "three", "twelve"])
def test_figures_of_a_study_with_trials_can_be_read(page, name):
    open_study(page, name)
    for plot in COUNTED:
        labels = x_tick_labels(page, plot)
        assert labels and all(label.is_integer() for label in labels), (plot, labels)
    bands = page.evaluate("""() => {
        const plot = document.getElementById("tuning-curves"), [bottom, top] = plot._fullLayout.yaxis.range;
        return plot._fullData.filter(t => t.fill === "toself").map(t => ({
            inside: t.y.every(y => y >= bottom - 1e-9 && y <= top + 1e-9), markers: t.mode.includes("markers"),
            left: Math.min(...t.x), right: Math.max(...t.x), family: t.legendgroup,
            drawn: plot.querySelectorAll(".fills path").length}));
    }""")
    assert {band["family"] for band in bands} == ({"lstm"} if name == "one" else {"lstm", "mogrifier"})
    for band in bands:
        assert band["inside"] and not band["markers"] and band["drawn"] >= len(bands)
        assert band["left"] == 0.5  # the band at n = 1 is drawn, open as it is
    assert "open there" in shown_words(page, "tuning-curves")
    assert page.locator("#history .scatterlayer .point").count() >= 1
    assert page.locator("#parallel .scatterlayer .trace").count() >= 1


def test_learning_curves_include_running_trials(page, base_url):
    running = httpx.get(f"{base_url}/studies/three/trials", params={"state": "RUNNING"}).json()["items"]
    assert len(running) == 2
    open_study(page, "three")
    names = page.evaluate("document.getElementById('curves').data.map(t => t.name)")
    for trial in running:
        assert f"{trial['family']} #{trial['number']} valid" in names
    assert page.evaluate("Math.max(...document.getElementById('curves').data.flatMap(t => t.x))") == 9
