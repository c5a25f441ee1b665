"""Parallel coordinates of one family's complete trials, with the neighbourhood of the best highlighted.

The neighbourhood (as in the sensitivity plots of Melis' thesis, Figures 2.5/2.6) is the set of trials
whose every hyperparameter lies within `fraction` of its searched range from the best trial's value,
measured on the log scale for log-scaled hyperparameters; categorical ones must match.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboards.figures import styled

NEIGHBOURHOOD = 0.15
MAX_LINES = 400  # beyond a few hundred lines parallel coordinates are a blur that takes seconds to draw
COLOURS = [[0.0, "#c8c8c8"], [0.5, "#ff7f0e"], [1.0, "#d62728"]]  # other, neighbourhood, best


@dataclass(frozen=True)
class Range:
    """A searched range: numeric (low, high, log) or categorical (choices)."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple | None = None

    def scaled(self, values: pd.Series) -> np.ndarray:
        """Values on [0, 1] across the range (log scale where searched on one)."""
        values = values.astype(float).to_numpy()
        if self.log:
            return (np.log(values) - np.log(self.low)) / (np.log(self.high) - np.log(self.low))
        return (values - self.low) / (self.high - self.low)


def neighbourhood(trials: pd.DataFrame, ranges: Mapping[str, Range], best_trial_id: int,
                  fraction: float = NEIGHBOURHOOD) -> pd.Series:
    """True for trials within `fraction` of every range from the best trial (the best included)."""
    best = trials.loc[trials["trial_id"] == best_trial_id].iloc[0]
    inside = pd.Series(True, index=trials.index)
    for name, declared in ranges.items():
        if declared.choices is not None:
            inside &= trials[name] == best[name]
        elif declared.high > declared.low:
            distance = np.abs(declared.scaled(trials[name]) - declared.scaled(pd.Series([best[name]]))[0])
            inside &= distance <= fraction + 1e-12
    return inside


def parallel_figure(trials: pd.DataFrame, ranges: Mapping[str, Range], best_trial_id: int | None, y_title: str,
                    family: str, fraction: float = NEIGHBOURHOOD, max_lines: int = MAX_LINES) -> go.Figure:
    """One axis per hyperparameter plus the score; lines coloured grey, orange (neighbourhood), red (best).
    `trials`: trial_id, score and one column per hyperparameter in `ranges`. Only the best `max_lines`
    trials and the whole neighbourhood are drawn."""
    figure = go.Figure()
    if trials.empty or best_trial_id is None:
        return styled(figure, f"Parallel coordinates: {family} (no complete trials yet)", "", "")
    near = neighbourhood(trials, ranges, best_trial_id, fraction)
    drawn = near | (trials["score"].rank(method="first") <= max_lines)  # the best, and every neighbour
    total, trials, near = len(trials), trials[drawn], near[drawn]
    colour = np.where(trials["trial_id"] == best_trial_id, 1.0, np.where(near, 0.5, 0.0))
    order = np.argsort(colour, kind="stable")  # highlighted lines drawn last, on top
    ordered = trials.iloc[order]
    dimensions = [_dimension(name, declared, ordered[name]) for name, declared in ranges.items()]
    dimensions.append({"label": y_title, "values": ordered["score"].to_numpy()})
    figure.add_trace(go.Parcoords(
        line={"color": colour[order], "colorscale": COLOURS, "cmin": 0.0, "cmax": 1.0},
        dimensions=dimensions, name=family))
    shown = "" if len(trials) == total else f"; the best {len(trials)} of {total} trials drawn"
    title = (f"{family}: best trial (red) and {int(near.sum()) - 1} within ±{fraction:.0%} of every range "
             f"(orange){shown}")
    return styled(figure, title, "", "", margin={"l": 60, "r": 60, "t": 90, "b": 30}, title_font_size=14)


def _dimension(name: str, declared: Range, values: pd.Series) -> dict:
    if declared.choices is not None:
        labels = [str(choice) for choice in declared.choices]
        index = {choice: position for position, choice in enumerate(declared.choices)}
        return {"label": name, "values": values.map(index).to_numpy(), "tickvals": list(range(len(labels))),
                "ticktext": labels}
    if declared.log:
        ticks = np.geomspace(declared.low, declared.high, 5)
        return {"label": f"{name} (log)", "values": np.log10(values.astype(float).to_numpy()),
                "range": [np.log10(declared.low), np.log10(declared.high)], "tickvals": np.log10(ticks),
                "ticktext": [f"{tick:.3g}" for tick in ticks]}
    return {"label": name, "values": values.astype(float).to_numpy(), "range": [declared.low, declared.high]}
