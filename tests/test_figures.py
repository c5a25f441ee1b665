"""Figure builders are pure functions: checked on hand-made frames."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dashboards import (
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
    data = figure_json(pareto_figure(frame))
    json.dumps(data)  # plain JSON: no numpy arrays or base64 typed arrays left
    traces = {trace["name"]: trace for trace in data["data"]}
    assert traces["lstm"]["x"] == [100, 80] and traces["mogrifier"]["y"] == [6.0]
    assert traces["non-dominated"]["x"] == [80, 90, 100]  # every point is on this front
    assert traces["lstm"]["marker"]["color"] != traces["mogrifier"]["marker"]["color"]


def test_pareto_figure_without_finished_trials_is_empty():
    empty = pd.DataFrame(columns=["trial_id", "family", "number", "parameter_count", "perplexity"])
    assert figure_json(pareto_figure(empty))["data"] == []


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


def test_parallel_figure_has_an_axis_per_hyperparameter_and_highlights_the_best():
    ranges = {"learning_rate": Range(0.001, 0.1, log=True), "dropout": Range(0.0, 1.0)}
    trials = pd.DataFrame({"trial_id": [1, 2, 3], "learning_rate": [0.01, 0.011, 0.09], "dropout": [0.5, 0.55, 0.1],
                           "score": [5.0, 6.0, 7.0]})
    (trace,) = figure_json(parallel_figure(trials, ranges, 1, "validation perplexity", "lstm"))["data"]
    labels = [d["label"] for d in trace["dimensions"]]
    assert labels == ["learning_rate (log)", "dropout", "validation perplexity"]
    assert trace["line"]["color"] == [0.0, 0.5, 1.0]  # other, neighbourhood, best (drawn last)
    assert trace["dimensions"][2]["values"] == [7.0, 6.0, 5.0]
    assert trace["dimensions"][0]["values"] == pytest.approx(np.log10([0.09, 0.011, 0.01]).tolist())


def test_importance_figure_groups_families_most_important_on_top():
    data = figure_json(importance_figure({"lstm": {"lr": 0.7, "dropout": 0.3}, "mogrifier": {"lr": 0.2,
                                                                                             "rounds": 0.8}},
                                         "fanova"))
    traces = {t["name"]: t for t in data["data"]}
    assert traces["lstm"]["y"] == ["dropout", "lr", "rounds"]  # plotly draws the last category on top
    assert traces["lstm"]["x"][:2] == [0.3, 0.7] and traces["mogrifier"]["x"] == [None, 0.2, 0.8]
