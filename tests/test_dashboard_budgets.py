"""The comparison page names its budget, in a real browser (Debian's Chromium through Playwright): a study whose
verdict flips between equal tokens and equal compute shows both winners, the sentence that they differ and the
best-so-far curves against both budgets; a study of one family names no winner. The studies are written to the
database directly (tests/test_equal_budgets.py), so that the verdicts are certain."""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import pytest

from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.store.engine import ensure_schema
from tests.conftest import serve_app
from tests.test_dashboard_browser import browser, open_page, page, traces  # noqa: F401 (fixtures)
from tests.test_equal_budgets import FLIP, TURNS, flip_study, tuned
from tests.test_progress import add_study

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[str, Settings]]:
    root = tmp_path_factory.mktemp("budgets")
    settings = Settings(f"sqlite:///{root / 'tuner.db'}", root / "artifacts")
    ensure_schema(settings.storage_url)
    flip_study(settings.storage_url)
    add_study(settings.storage_url, "alone", status="complete")
    tuned(settings.storage_url, "alone", {"lstm": TURNS["lstm"]})
    with serve_app(settings) as base_url:
        yield base_url, settings


def test_the_page_shows_both_winners_and_why_they_differ(page, server):  # noqa: F811 (a fixture)
    open_page(page, "/dashboard/studies/flip/comparison")
    served = httpx.get(f"{server[0]}/studies/flip/comparison").json()
    assert page.locator("#winner-at-equal-tokens").inner_text() == "mogrifier"
    assert page.locator("#winner-at-equal-compute").inner_text() == "lstm"
    assert page.locator("#budget-verdict").inner_text() == served["budget_verdict"]
    assert page.locator("#budget-verdict").inner_text().startswith(FLIP)
    assert page.locator("#winner").inner_text() == "mogrifier"
    assert page.locator("#winner-holds-at").inner_text() == served["winner_holds_at"]
    cells = page.locator("#budgets tr[data-family=mogrifier] td").all_inner_texts()
    assert cells == ["mogrifier", "4.00k", "8", "500", f"{math.exp(4.3):.3f}", f"{math.exp(4.7):.3f}"]
    page.wait_for_selector("#budget-curves[data-ready=true]")
    curves = traces(page, "budget-curves")
    assert set(curves) == {"lstm (1,000 tokens per core-second)", "mogrifier (500 tokens per core-second)"}
    shapes = page.evaluate("document.getElementById('budget-curves').layout.shapes.map(s => [s.xref, s.x0])")
    assert shapes == [["x", 4000], ["x2", 4]]  # the equal points
    assert page.evaluate("document.getElementById('pareto').layout.xaxis.title.text") == "compute (CPU core-seconds)"
    assert page.locator("select[data-plot=pareto]").input_value() == "compute"


def test_the_page_of_one_family_names_no_winner(page):  # noqa: F811 (a fixture)
    open_page(page, "/dashboard/studies/alone/comparison")
    assert page.locator("#winner").count() == 0
    assert page.locator("#verdict").inner_text() == "one family (lstm): nothing to compare it with, so no winner"
    assert page.locator("#winner-at-equal-tokens").inner_text() == "none"
