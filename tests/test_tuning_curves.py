"""Tuning curves (tuner/analysis/tuning_curves.py): Dodge et al.'s expected best against values worked by hand,
the median best's band (opda) and its coverage on a synthetic distribution, the verdict's wording, and the
curves through REST and `tuner curves`. Trial rows are written directly (no Ray, no training)."""

from __future__ import annotations

from importlib.metadata import version

import httpx
import numpy as np
import pytest
from opda.nonparametric import EmpiricalDistribution
from scipy import stats
from typer.testing import CliRunner

from lm_tuner.tuner.analysis import curve_bands
from lm_tuner.tuner.analysis.curve_bands import confidence_band
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


@pytest.fixture
def band_cache(tmp_path, monkeypatch):
    """An empty cache folder, and no band weights remembered by this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    curve_bands.band_weights.cache_clear()
    yield curve_bands.cache_folder()
    curve_bands.band_weights.cache_clear()


@pytest.mark.parametrize("values", [
    np.random.default_rng(3).gamma(2.0, 0.15, size=40) + 4.6,
    np.array([4.2, 4.0, 4.2, 4.9, 4.0, 4.0, 5.5]),  # ties: each tied trial must get opda's weight
    np.array([4.4]),
])
def test_the_band_built_from_kept_weights_is_opda_s_band(values, band_cache):
    confidence = 0.95 ** 0.5
    theirs = EmpiricalDistribution.confidence_bands(values, confidence, a=0.0, method="ld_equal_tailed",
                                                    generator=np.random.default_rng(0), n_jobs=1)
    ns = np.arange(1, len(values) + 1)
    for ours in (confidence_band(values, confidence), confidence_band(values, confidence)):  # computed, remembered
        for mine, opda_s in zip(ours, theirs, strict=True):
            assert np.array_equal(mine.ys, opda_s.ys)
            assert (mine.ws is None and opda_s.ws is None) or np.array_equal(mine.ws, opda_s.ws)
            assert np.array_equal(mine.quantile_tuning_curve(ns, minimize=True),
                                  opda_s.quantile_tuning_curve(ns, minimize=True))


def test_a_band_is_simulated_once_per_size_and_then_read_from_disk(band_cache, monkeypatch):
    simulations = []
    simulate = curve_bands._simulate
    monkeypatch.setattr(curve_bands, "_simulate", lambda *args: simulations.append(args) or simulate(*args))
    values = np.random.default_rng(4).normal(4.5, 0.1, size=30)
    first = family_curve("any", values, 0.975, PERPLEXITY)
    curve_bands.band_weights.cache_clear()  # as a new process (another `tuner curves`, a restarted API) would
    again = family_curve("any", values[::-1], 0.975, PERPLEXITY)
    assert simulations == [(30, 0.975)] and first == again
    assert [path.name for path in band_cache.iterdir()] == [
        f"ld_equal_tailed-opda{version('opda')}-seed0-n30-c0.975.npz"]
    family_curve("any", values[:29], 0.975, PERPLEXITY)
    family_curve("any", values, 0.9, PERPLEXITY)
    assert simulations == [(30, 0.975), (29, 0.975), (30, 0.9)]


def test_an_unreadable_or_unwritable_cache_costs_only_time(band_cache, tmp_path, monkeypatch, caplog):
    values = np.random.default_rng(5).normal(4.5, 0.1, size=12)
    kept = family_curve("any", values, 0.95, PERPLEXITY)
    (path,) = band_cache.iterdir()
    path.write_bytes(path.read_bytes()[:100])  # cut short, as by a full disk
    curve_bands.band_weights.cache_clear()
    assert family_curve("any", values, 0.95, PERPLEXITY) == kept
    assert "unreadable" in caplog.text and np.load(path)["lower"].shape == (14,)  # computed and kept again
    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-folder"))
    curve_bands.band_weights.cache_clear()
    assert family_curve("any", values, 0.95, PERPLEXITY) == kept
    assert "cannot write" in caplog.text
