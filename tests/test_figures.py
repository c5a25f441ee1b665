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
    assert data["data"] == [] and "no complete trials yet" in data["layout"]["title"]["text"]


def test_importance_figure_groups_families_most_important_on_top():
    data = figure_json(importance_figure({"lstm": {"lr": 0.7, "dropout": 0.3}, "mogrifier": {"lr": 0.2,
                                                                                             "rounds": 0.8}},
                                         "fanova"))
    traces = {t["name"]: t for t in data["data"]}
    assert traces["lstm"]["y"] == ["dropout", "lr", "rounds"]  # plotly draws the last category on top
    assert traces["lstm"]["x"][:2] == [0.3, 0.7] and traces["mogrifier"]["x"] == [None, 0.2, 0.8]
