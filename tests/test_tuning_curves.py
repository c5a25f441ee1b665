"""Tuning curves (tuner/analysis/tuning_curves.py): Dodge et al.'s expected best against values worked by hand,
the median best's band (opda) and its coverage on a synthetic distribution, the verdict's wording, and the
curves through REST and `tuner curves`. Trial rows are written directly (no Ray, no training)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from lm_tuner.tuner.analysis.tuning_curves import expected_best, family_curve, tuning_curves, verdict
from lm_tuner.tuner.cli.app import app
from lm_tuner.tuner.settings import Settings
from lm_tuner.tuner.spec.units import unit_of
from tests.conftest import serve_app
from tests.test_progress import add_study
from tests.test_reports import TWO_FAMILIES, trial

PERPLEXITY = unit_of({})
FIRST, SECOND = TWO_FAMILIES["families"]


def test_expected_best_matches_the_order_statistics_worked_by_hand():
    values = np.array([3.0, 1.0, 2.0])
    by_hand = [2.0,  # n = 1: the mean
               1 * (1 - (2 / 3) ** 2) + 2 * ((2 / 3) ** 2 - (1 / 3) ** 2) + 3 * (1 / 3) ** 2,
               1 * (1 - (2 / 3) ** 3) + 2 * ((2 / 3) ** 3 - (1 / 3) ** 3) + 3 * (1 / 3) ** 3]
    assert expected_best(values, np.array([1, 2, 3])) == pytest.approx(by_hand)
    assert expected_best(np.array([5.0, 5.0, 7.0, 9.0]), np.array([2]))[0] == pytest.approx(
        5 * (1 - 0.5 ** 2) + 7 * (0.5 ** 2 - 0.25 ** 2) + 9 * 0.25 ** 2)


def test_curves_fall_with_n_and_the_band_holds_the_estimate():
    values = np.random.default_rng(0).gamma(2.0, 0.15, size=25) + 4.6
    curve = family_curve("any", values, 0.95, PERPLEXITY)
    expected = [p.expected_best for p in curve.points]
    assert len(curve.points) == 25 and np.all(np.diff(expected) <= 1e-12)
    assert np.all(np.diff([p.median_best for p in curve.points]) <= 0)
    assert all(p.lower <= p.median_best <= p.upper for p in curve.points)
    assert curve.points[0].lower > 4.6 and np.isfinite(curve.points[0].upper)  # informative where trials are
    assert curve.expected_best_scores[0] == pytest.approx(np.exp(values).mean())  # the mean perplexity, not exp(mean)


def test_the_band_covers_the_true_median_best_at_every_n_at_once():
    distribution, trials = stats.gamma(2.0, loc=4.6, scale=0.15), 20
    n = np.arange(1, trials + 1)
    truth = distribution.ppf(1 - 0.5 ** (1 / n))  # the median of the best of n draws, when lower is better
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(200):
        curve = family_curve("any", distribution.rvs(size=trials, random_state=rng), 0.95, PERPLEXITY)
        lower, upper = (np.array([getattr(p, end) for p in curve.points]) for end in ("lower", "upper"))
        covered += bool(np.all((lower <= truth) & (truth <= upper)))
    assert covered >= 0.93 * 200


def test_the_verdict_names_the_better_family_only_where_the_bands_are_apart():
    rng = np.random.default_rng(1)
    apart = [family_curve(f, rng.normal(mean, 0.02, size=40), 0.975, PERPLEXITY) for f, mean in (("b", 5.3),
                                                                                                 ("a", 4.8))]
    said = verdict(apart, 0.95)
    assert said.startswith("a is better at every n up to ") and "95% confidence" in said
    assert "the bands overlap at n = " in said  # beyond the few trials' reach, the band is open below
    together = [family_curve(f, rng.normal(5.0, 0.2, size=12), 0.975, PERPLEXITY) for f in ("a", "b")]
    assert verdict(together, 0.95) == "the bands overlap up to n = 12: not enough trials to tell"
    assert "nothing to compare" in verdict(together[:1], 0.95)


def test_a_study_s_curves_count_only_its_complete_tuning_trials(sqlite_url):
    add_study(sqlite_url, "tuned", **TWO_FAMILIES, tuning={"trials": 6, "concurrency": 2})
    for value in (4.0, 4.2, 4.4, 4.1):
        trial(sqlite_url, "tuned", FIRST, "COMPLETE", value)
    trial(sqlite_url, "tuned", FIRST, "FAIL")
    trial(sqlite_url, "tuned", FIRST, "PRUNED")
    trial(sqlite_url, "tuned", FIRST, "COMPLETE", 1.0, stage="rerun")
    trial(sqlite_url, "tuned", SECOND, "COMPLETE", 5.0)
    found = tuning_curves(sqlite_url, "tuned")
    assert [(c.family, c.trials) for c in found.families] == [(FIRST, 4), (SECOND, 1)]
    assert found.families[0].points[0].expected_best == pytest.approx(4.175)
    assert tuning_curves(sqlite_url, "missing") is None


def test_rest_answers_rows_method_and_verdict(sqlite_url, tmp_path):
    add_study(sqlite_url, "served", **TWO_FAMILIES, tuning={"trials": 5, "concurrency": 2})
    for value in (4.0, 4.3, 4.1):
        trial(sqlite_url, "served", FIRST, "COMPLETE", value)
        trial(sqlite_url, "served", SECOND, "COMPLETE", value + 0.5)
    with serve_app(Settings(sqlite_url, tmp_path / "artifacts")) as base:
        body = httpx.get(f"{base}/studies/served/tuning-curves", params={"confidence": 0.9}).json()
        missing = httpx.get(f"{base}/studies/nothing/tuning-curves")
        refused = httpx.get(f"{base}/studies/served/tuning-curves", params={"confidence": 1.5})
        too_sure = httpx.get(f"{base}/studies/served/tuning-curves", params={"confidence": 0.9999999999999999})
        page = httpx.get(f"{base}/dashboard/studies/served")
    assert body["confidence"] == 0.9 and body["unit"] == "perplexity" and "opda" in body["method"]
    assert [f["family"] for f in body["families"]] == [FIRST, SECOND]
    rows = body["families"][0]["rows"]
    assert [r["n"] for r in rows] == [1, 2, 3]
    assert rows[0]["expected_best"] == pytest.approx(np.mean([4.0, 4.3, 4.1]))
    assert rows[0]["expected_best_score"] == pytest.approx(np.mean(np.exp([4.0, 4.3, 4.1])))
    assert all(r["upper"] is None or r["lower"] <= r["median_best"] <= r["upper"] for r in rows)
    assert body["verdict"] == "the bands overlap up to n = 3: not enough trials to tell"
    assert len(body["figure"]["data"]) == 4  # a band and a line per family
    assert missing.status_code == 404
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "confidence"]
    assert too_sure.status_code == 422  # schemathesis found a 500 here: the families' bands rounded to 1
    assert 'data-src="/studies/served/tuning-curves"' in page.text


def test_cli_prints_a_table_per_family_and_writes_the_figure(sqlite_url, tmp_path):
    add_study(sqlite_url, "printed", **TWO_FAMILIES, tuning={"trials": 5, "concurrency": 2})
    for value in (4.0, 4.3):
        trial(sqlite_url, "printed", FIRST, "COMPLETE", value)
        trial(sqlite_url, "printed", SECOND, "COMPLETE", value + 1)
    figure = tmp_path / "curves.html"
    result = CliRunner().invoke(app, ["curves", "printed", "--figure", str(figure), "--storage", sqlite_url],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"{FIRST}: 2 complete tuning trials" in result.output and "the bands overlap up to n = 2" in result.output
    assert f"{np.exp(4.0) / 2 + np.exp(4.3) / 2:.2f}" in result.output  # n = 1: the mean perplexity
    assert "plotly" in figure.read_text()[:5000].lower()
    picture = tmp_path / "curves.png"  # kaleido drives the Chromium that the browser tests use
    drawn = CliRunner().invoke(app, ["curves", "printed", "--figure", str(picture), "--storage", sqlite_url])
    assert drawn.exit_code == 0, drawn.output
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    unknown = CliRunner().invoke(app, ["curves", "nothing", "--storage", sqlite_url])
    assert unknown.exit_code == 1
    wrong = CliRunner().invoke(app, ["curves", "printed", "--confidence", "1", "--storage", sqlite_url])
    assert wrong.exit_code == 2 and "--confidence" in wrong.output
