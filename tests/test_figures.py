"""Figure builders are pure functions: checked on hand-made frames."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from lm_tuner.dashboards import (
    Range,
    averaging_switches,
    curves_figure,
    figure_json,
    history_figure,
    importance_figure,
    neighbourhood,
    non_dominated,
    parallel_figure,
    pareto_figure,
)
from lm_tuner.dashboards.figures import whole_number_ticks
from lm_tuner.dashboards.tuning_curves import tuning_curves_figure
from lm_tuner.tuner.analysis.tuning_curves import METHOD, TuningCurves, family_curve, verdict
from lm_tuner.tuner.spec.units import unit_of
from tests.conftest import TINY_SPEC


def brute_force_front(frame: pd.DataFrame, x: str, y: str) -> list[bool]:
    xs, ys = frame[x].to_numpy(), frame[y].to_numpy()
    return [not ((xs <= xi) & (ys <= yi) & ((xs < xi) | (ys < yi))).any() for xi, yi in zip(xs, ys, strict=True)]


def test_non_dominated_matches_the_definition_including_ties():
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"x": rng.integers(0, 20, 400), "y": rng.integers(0, 20, 400)})  # many ties
    assert non_dominated(frame, "x", "y").tolist() == brute_force_front(frame, "x", "y")
    small = pd.DataFrame({"x": [1, 1, 2, 3, 3], "y": [5, 5, 4, 4, 1]})
    assert non_dominated(small, "x", "y").tolist() == [True, True, True, False, True]


def test_pareto_figure_colours_families_and_serialises_plainly():
    frame = pd.DataFrame({"trial_id": [1, 2, 3], "family": ["lstm", "mogrifier", "lstm"], "number": [0, 0, 1],
                          "parameter_count": [100, 90, 80], "perplexity": [5.0, 6.0, 7.0]})
    data = figure_json(pareto_figure(frame, x="parameter_count", x_title="trainable parameters"))
    json.dumps(data)  # plain JSON: no numpy arrays or base64 typed arrays left
    traces = {trace["name"]: trace for trace in data["data"]}
    assert traces["lstm"]["x"] == [100, 80] and traces["mogrifier"]["y"] == [6.0]
    assert traces["non-dominated"]["x"] == [80, 90, 100]  # every point is on this front
    assert traces["lstm"]["marker"]["color"] != traces["mogrifier"]["marker"]["color"]


def test_pareto_figure_without_finished_trials_is_empty():
    empty = pd.DataFrame(columns=["trial_id", "family", "number", "parameter_count", "perplexity"])
    assert figure_json(pareto_figure(empty, x="parameter_count"))["data"] == []


def test_averaging_switches_mark_starts_and_restarts():
    curve = pd.DataFrame({"turn": [1, 2, 3, 4, 5, 6, 7], "averaging_length": [1, 1, 40, 80, 5, 9, None]})
    assert averaging_switches(curve) == [3, 5, 7]  # starts, restarts (falls), stops (back to raw weights)
    assert averaging_switches(pd.DataFrame({"turn": [1, 2], "averaging_length": [None, 1]})) == []


def test_curves_figure_draws_valid_train_and_switch_markers_per_trial():
    turns = pd.DataFrame({
        "trial_id": [7, 7, 7, 9, 9, 9], "family": ["lstm"] * 3 + ["mogrifier"] * 3, "stage": ["tune"] * 6,
        "number": [0, 0, 0, 2, 2, 2], "turn": [1, 2, 3, 1, 2, 3], "train_score": [9.0, 8.0, 7.0, 9.5, 8.5, 7.5],
        "val_score": [10.0, 9.0, 8.5, 10.5, 9.5, 9.0], "averaging_length": [1, 20, 40, 1, 1, 1]})
    traces = {t["name"]: t for t in figure_json(curves_figure(turns, "validation perplexity"))["data"]}
    assert set(traces) == {"lstm #0 valid", "lstm #0 train", "lstm #0 averaging switch", "mogrifier #2 valid",
                           "mogrifier #2 train"}
    assert traces["lstm #0 averaging switch"]["x"] == [2] and traces["lstm #0 averaging switch"]["y"] == [9.0]
    assert traces["mogrifier #2 valid"]["y"] == [10.5, 9.5, 9.0]
    assert traces["lstm #0 train"]["line"]["dash"] == "dot"


def test_history_shows_best_so_far_steps_and_keeps_pruned_and_failed_visible():
    trials = pd.DataFrame({
        "trial_id": [1, 2, 3, 4, 5, 6], "family": ["lstm"] * 6, "number": [0, 1, 2, 3, 4, 5],
        "state": ["COMPLETE", "COMPLETE", "PRUNED", "FAIL", "COMPLETE", "COMPLETE"],
        "score": [10.0, 12.0, np.nan, np.nan, 8.0, 9.0], "last_score": [np.nan, np.nan, 15.0, np.nan, np.nan, np.nan],
        "fail_reason": [None, None, None, "diverged", None, None]})
    traces = {t["name"]: t for t in figure_json(history_figure(trials, "validation perplexity"))["data"]}
    assert traces["lstm"]["x"] == [0, 1, 4, 5] and traces["lstm"]["y"] == [10.0, 12.0, 8.0, 9.0]
    best = traces["lstm best so far"]
    assert best["x"] == [0, 4, 5] and best["y"] == [10.0, 8.0, 8.0] and best["line"]["shape"] == "hv"
    assert traces["lstm pruned"]["x"] == [2] and traces["lstm pruned"]["y"] == [15.0]
    assert traces["lstm failed"]["x"] == [3] and traces["lstm failed"]["customdata"] == ["diverged"]
    assert traces["lstm failed"]["marker"]["symbol"] == "x"
    # trial 0 and the last trial lie within the axis, not on its edges where half of a marker is cut off
    assert figure_json(history_figure(trials, "validation perplexity"))["layout"]["xaxis"]["range"] == [-0.5, 5.5]


def test_neighbourhood_is_within_fifteen_percent_of_every_range_on_its_scale():
    ranges = {"learning_rate": Range(0.001, 0.1, log=True), "dropout": Range(0.0, 1.0),
              "cell": Range(choices=("lstm", "gru"))}
    trials = pd.DataFrame({
        "trial_id": [1, 2, 3, 4, 5],
        "learning_rate": [0.01, 0.01 * 10 ** (0.29), 0.01 * 10 ** (0.31), 0.01, 0.01],  # range: 2 decades
        "dropout": [0.5, 0.5, 0.5, 0.66, 0.6],
        "cell": ["lstm", "lstm", "lstm", "lstm", "gru"], "score": [5.0, 6.0, 7.0, 8.0, 9.0]})
    assert neighbourhood(trials, ranges, best_trial_id=1).tolist() == [True, True, False, False, False]


def parallel_traces(*args, **kwargs) -> tuple[dict, dict]:
    """The figure's traces by name, and its layout, as the API sends them."""
    data = figure_json(parallel_figure(*args, **kwargs))
    json.dumps(data)  # plain JSON: the separators between polylines are null, not NaN
    return {trace["name"]: trace for trace in data["data"]}, data["layout"]


def trial_ids(trace: dict) -> set[int]:
    return {trial_id for trial_id, _ in trace["customdata"]}


def test_parallel_figure_has_an_axis_per_hyperparameter_and_highlights_the_best():
    ranges = {"learning_rate": Range(0.001, 0.1, log=True), "dropout": Range(0.0, 1.0)}
    trials = pd.DataFrame({"trial_id": [1, 2, 3], "learning_rate": [0.01, 0.011, 0.09], "dropout": [0.5, 0.55, 0.1],
                           "score": [5.0, 6.0, 7.0]})
    traces, layout = parallel_traces(trials, ranges, 1, "validation perplexity", "lstm")
    assert layout["xaxis"]["ticktext"] == ["learning_rate (log)", "dropout", "validation perplexity"]
    assert layout["xaxis"]["tickvals"] == [0, 1, 2] and layout["yaxis"]["showticklabels"] is False
    assert [(shape["x0"], shape["y0"], shape["y1"]) for shape in layout["shapes"]] == [(0, 0, 1), (1, 0, 1), (2, 0, 1)]
    assert list(traces) == ["other", "neighbourhood", "best"]  # highlighted lines drawn last, on top
    assert [trial_ids(trace) for trace in traces.values()] == [{3}, {2}, {1}]
    assert all(trace["type"] == "scatter" for trace in traces.values())
    best = traces["best"]
    assert best["x"] == [0, 1, 2]
    assert best["y"] == pytest.approx([0.5, 0.5, 0.0])  # log-scaled rate, dropout, the lowest score
    assert [value for _, value in best["customdata"]] == ["0.01", "0.5", "5"]  # hover: the raw values
    assert traces["other"]["y"][2] == 1.0  # the highest score tops its axis
    marks = {(mark["x"], mark["y"]): mark["text"] for mark in layout["annotations"]}
    assert marks == {(0, 0.0): "0.001", (0, 1.0): "0.1", (1, 0.0): "0", (1, 1.0): "1", (2, 0.0): "5",
                     (2, 1.0): "7"}


def test_parallel_figure_places_choices_by_index_and_leaves_out_trials_beyond_max_lines():
    ranges = {"cell": Range(choices=("lstm", "gru", "rnn")), "dropout": Range(0.0, 1.0)}
    trials = pd.DataFrame({"trial_id": [1, 2, 3, 4, 5], "cell": ["lstm", "lstm", "rnn", "gru", "gru"],
                           "dropout": [0.5, 0.55, 0.1, 0.9, 0.2], "score": [5.0, 9.0, 6.0, 7.0, 8.0]})
    traces, layout = parallel_traces(trials, ranges, 1, "validation perplexity", "lstm", max_lines=2)
    assert layout["xaxis"]["ticktext"] == ["cell", "dropout", "validation perplexity"]
    assert trial_ids(traces["best"]) == {1} and trial_ids(traces["neighbourhood"]) == {2}  # kept: the worst
    assert trial_ids(traces["other"]) == {3}  # trials 4 and 5 are beyond the best two
    assert traces["other"]["y"][0] == 1.0 and traces["best"]["y"][0] == 0.0  # rnn is the last choice, lstm the first
    assert traces["neighbourhood"]["y"][2] == 1.0  # scores scaled across the drawn trials: 5 to 9
    assert "the best 3 of 5 trials drawn" in layout["title"]["text"]
    choices = [(mark["y"], mark["text"]) for mark in layout["annotations"] if mark["x"] == 0]
    assert choices == [(0.0, "lstm"), (0.5, "gru"), (1.0, "rnn")]


def test_parallel_figure_joins_a_groups_polylines_with_gaps():
    ranges = {"dropout": Range(0.0, 1.0)}
    trials = pd.DataFrame({"trial_id": [1, 2, 3], "dropout": [0.5, 0.1, 0.9], "score": [5.0, 7.0, 6.0]})
    traces, _ = parallel_traces(trials, ranges, 1, "validation perplexity", "lstm")
    assert list(traces) == ["other", "best"]  # no neighbours: no neighbourhood trace
    other = traces["other"]
    assert other["x"] == [0, 1, None, 0, 1] and other["y"] == pytest.approx([0.1, 1.0, None, 0.9, 0.5])
    assert [trial_id for trial_id, _ in other["customdata"]] == [2, 2, 2, 3, 3]


def test_parallel_figure_without_complete_trials_is_empty():
    empty = pd.DataFrame(columns=["trial_id", "dropout", "score"])
    data = figure_json(parallel_figure(empty, {"dropout": Range(0.0, 1.0)}, None, "validation perplexity", "lstm"))
    assert data["data"] == [] and data["layout"]["annotations"][0]["text"] == "No complete lstm trial yet."


def test_importance_figure_groups_families_most_important_on_top():
    data = figure_json(importance_figure({"lstm": {"lr": 0.7, "dropout": 0.3}, "mogrifier": {"lr": 0.2,
                                                                                             "rounds": 0.8}},
                                         "fanova"))
    traces = {t["name"]: t for t in data["data"]}
    assert traces["lstm"]["y"] == ["dropout", "lr", "rounds"]  # plotly draws the last category on top
    assert traces["lstm"]["x"][:2] == [0.3, 0.7] and traces["mogrifier"]["x"] == [None, 0.2, 0.8]


def nothing_drawn(figure) -> str:
    """The words a figure shows in place of bare axes (failing if it draws anything or shows axes)."""
    layout = figure_json(figure)["layout"]
    assert not any(trace.get("x") or trace.get("y") for trace in figure_json(figure)["data"])
    assert layout["xaxis"] == {"visible": False} and layout["yaxis"] == {"visible": False}
    (note,) = layout["annotations"]
    return note["text"]


def test_a_figure_with_nothing_to_draw_says_so_in_words_not_with_axes_from_minus_one_to_four():
    nobody = pd.DataFrame(columns=["trial_id", "family", "number", "state", "score", "last_score", "fail_reason"])
    assert nothing_drawn(history_figure(nobody, "perplexity")) == "No tuning trial has finished yet."
    running = pd.DataFrame({"trial_id": [1, 2], "family": ["lstm", "mogrifier"], "number": [0, 0],
                            "state": ["RUNNING", "RUNNING"], "score": [np.nan, np.nan],
                            "last_score": [np.nan, np.nan], "fail_reason": [None, None]})
    assert nothing_drawn(history_figure(running, "perplexity")) == "No tuning trial has finished yet (2 running)."
    no_turns = pd.DataFrame(columns=["trial_id", "family", "stage", "number", "turn", "train_score", "val_score",
                                     "averaging_length"])
    assert nothing_drawn(curves_figure(no_turns, "perplexity")) == "No trial has reported a turn yet."
    assert nothing_drawn(importance_figure({"lstm": {}, "mogrifier": {}}, "ped_anova")).startswith(
        "Importance needs two complete tuning trials of a family")
    assert nothing_drawn(tuning_curves_figure(curves_of({"lstm": [], "mogrifier": []}))).startswith(
        "No complete tuning trial yet")
    pareto = pareto_figure(pd.DataFrame(columns=["trial_id", "family", "number", "parameter_count", "perplexity"]),
                           x="parameter_count", x_title="trainable parameters")
    assert nothing_drawn(pareto) == "Nothing to draw yet."


def tick_labels(figure, axis: str = "xaxis") -> list[float]:
    """The tick positions plotly.js would label on a linear axis with the figure's tick0 and dtick, over the data."""
    layout = figure_json(figure)["layout"][axis]
    xs = [x for trace in figure_json(figure)["data"] for x in trace["x"] if x is not None]
    first = layout["tick0"] + np.ceil((min(xs) - layout["tick0"]) / layout["dtick"]) * layout["dtick"]
    return list(np.arange(first, max(xs) + 1e-9, layout["dtick"]))


def test_counts_are_ticked_on_whole_numbers_only():
    assert [whole_number_ticks(largest)["dtick"] for largest in (1, 3, 8, 9, 20, 45, 300, 1000)] == [
        1, 1, 1, 2, 5, 10, 50, 200]
    history = pd.DataFrame({"trial_id": [1, 2], "family": ["lstm", "lstm"], "number": [0, 1],
                            "state": ["COMPLETE", "COMPLETE"], "score": [50.0, 40.0], "last_score": [np.nan] * 2,
                            "fail_reason": [None, None]})
    turns = pd.DataFrame({"trial_id": [7, 7], "family": ["lstm"] * 2, "stage": ["tune"] * 2, "number": [0, 0],
                          "turn": [1, 2], "train_score": [60.0, 50.0], "val_score": [61.0, 52.0],
                          "averaging_length": [1, 1]})
    for figure in (history_figure(history, "perplexity"), curves_figure(turns, "perplexity"),
                   tuning_curves_figure(curves_of({"lstm": [4.0]}))):
        labels = tick_labels(figure)
        assert labels and all(float(label).is_integer() for label in labels)


def curves_of(families: dict[str, list[float]], confidence: float = 0.95) -> TuningCurves:
    unit = unit_of(TINY_SPEC)
    each = confidence ** (1 / len(families))
    found = [family_curve(family, np.array(values), each, unit) for family, values in families.items()]
    return TuningCurves("study", unit, confidence, METHOD, found, verdict(found, confidence))


@pytest.mark.parametrize("trials", [1, 3, 12])
def test_tuning_curve_bands_lie_within_the_axes_open_ends_at_their_edge_without_stray_markers(trials):
    rng = np.random.default_rng(trials)
    losses = {"lstm": list(rng.gamma(2.0, 0.15, trials) + 4.5), "mogrifier": list(rng.gamma(2.0, 0.15, trials) + 4.6)}
    found = curves_of(losses)
    data = figure_json(tuning_curves_figure(found))
    bottom, top = data["layout"]["yaxis"]["range"]
    bands = [trace for trace in data["data"] if trace.get("fill") == "toself"]
    lines = [trace for trace in data["data"] if trace.get("fill") != "toself"]
    assert len(bands) == len(lines) == 2
    for band, line, curve in zip(bands, lines, found.families, strict=True):
        assert band["mode"] == "lines" and band["line"]["width"] == 0  # no markers on the band's corners
        assert line["marker"]["color"] == line["line"]["color"] == band["fillcolor"]
        assert all(bottom <= y <= top for y in band["y"]) and all(bottom <= y <= top for y in line["y"])
        assert min(band["x"]) == 0.5 and max(band["x"]) == trials + 0.5  # n = 1 has its band, as wide as any n
        first = curve.points[0]  # a single trial bounds nothing: its band is open at both ends at n = 1
        bounded = [unit_of(TINY_SPEC).of(end) for p in curve.points for end in (p.lower, p.upper)
                   if 0 < end < np.inf]
        assert all(bottom <= y <= top for y in bounded)
        if trials == 1:
            assert first.lower == 0 and first.upper == np.inf
            assert sorted(set(band["y"])) == [bottom, top]
    assert "open there" in data["layout"]["annotations"][0]["text"]
