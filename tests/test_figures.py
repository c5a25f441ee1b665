"""Figure builders are pure functions: checked on hand-made frames."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from dashboards import figure_json, non_dominated, pareto_figure


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
