"""Parallel coordinates of one family's complete trials, with the neighbourhood of the best highlighted.

The neighbourhood (as in the sensitivity plots of Melis' thesis, Figures 2.5/2.6) is the set of trials
whose every hyperparameter lies within `fraction` of its searched range from the best trial's value,
measured on the log scale for log-scaled hyperparameters; categorical ones must match.

Drawn with SVG scatter lines (plotly.js's basic bundle has no `parcoords`, whose WebGL rendering also
takes seconds in a software-rendered browser): axis i sits at x = i and every value is scaled to [0, 1]
along its axis; the axes are layout shapes, their names x-axis tick labels, their ends annotations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from lm_tuner.dashboards.figures import styled

NEIGHBOURHOOD = 0.15
MAX_LINES = 400  # beyond a few hundred lines parallel coordinates are a blur that takes seconds to draw
LINES = {  # drawn in this order, so that highlighted lines lie on top
    "other": {"line": {"color": "#c8c8c8", "width": 1}, "opacity": 0.6},
    "neighbourhood": {"line": {"color": "#ff7f0e", "width": 1.5}},
    "best": {"line": {"color": "#d62728", "width": 3}},
}


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


class _Axis(NamedTuple):
    label: str
    positions: np.ndarray  # the trials' values scaled to [0, 1]
    values: np.ndarray  # the trials' raw values as text (object array)
    marks: list[tuple[float, str]]  # (position, text) annotated beside the axis


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
    """One axis per hyperparameter plus the score; lines grey, orange (neighbourhood), red (best).
    `trials`: trial_id, score and one column per hyperparameter in `ranges`. Only the best `max_lines`
    trials and the whole neighbourhood are drawn."""
    figure = go.Figure()
    if trials.empty or best_trial_id is None:
        return styled(figure, f"Parallel coordinates: {family}", "", "", empty=f"No complete {family} trial yet.")
    near = neighbourhood(trials, ranges, best_trial_id, fraction)
    drawn = near | (trials["score"].rank(method="first") <= max_lines)  # the best, and every neighbour
    total, trials, near = len(trials), trials[drawn], near[drawn].to_numpy()
    axes = [_axis(name, declared, trials[name]) for name, declared in ranges.items()]
    axes.append(_score_axis(y_title, trials["score"]))
    positions = np.column_stack([axis.positions for axis in axes])
    values = np.column_stack([axis.values for axis in axes])
    ids = trials["trial_id"].to_numpy()
    best = ids == best_trial_id
    for name, rows in (("other", ~near), ("neighbourhood", near & ~best), ("best", best)):
        if rows.any():
            figure.add_trace(_polylines(name, positions[rows], values[rows], ids[rows], [a.label for a in axes]))
    shown = "" if len(trials) == total else f"; the best {len(trials)} of {total} trials drawn"
    title = (f"{family}: best trial (red) and {int(near.sum()) - 1} within ±{fraction:.0%} of every range "
             f"(orange){shown}")
    shapes = [{"type": "line", "x0": x, "x1": x, "y0": 0, "y1": 1, "line": {"color": "#444", "width": 1}}
              for x in range(len(axes))]
    annotations = [_mark(x, y, text) for x, axis in enumerate(axes) for y, text in axis.marks]
    styled(figure, title, "", "", margin={"l": 60, "r": 60, "t": 90, "b": 30}, title_font_size=14,
           shapes=shapes, annotations=annotations)
    figure.update_xaxes(tickvals=list(range(len(axes))), ticktext=[axis.label for axis in axes],
                        range=[-0.3, len(axes) - 0.7], showgrid=False)
    return figure.update_yaxes(range=[-0.08, 1.08], showticklabels=False, showgrid=False)


def _axis(name: str, declared: Range, values: pd.Series) -> _Axis:
    if declared.choices is not None:
        steps = np.linspace(0.0, 1.0, len(declared.choices)) if len(declared.choices) > 1 else np.array([0.5])
        at = dict(zip(declared.choices, steps, strict=True))
        return _Axis(name, values.map(at).to_numpy(dtype=float), values.astype(str).to_numpy(dtype=object),
                     [(float(step), str(choice)) for step, choice in zip(steps, declared.choices, strict=True)])
    ends = ".3g" if declared.log else ".4g"
    positions = declared.scaled(values) if declared.high > declared.low else np.full(len(values), 0.5)
    return _Axis(f"{name} (log)" if declared.log else name, positions, _text(values),
                 [(0.0, f"{declared.low:{ends}}"), (1.0, f"{declared.high:{ends}}")])


def _score_axis(title: str, scores: pd.Series) -> _Axis:
    scores = scores.astype(float)
    low, high = float(scores.min()), float(scores.max())
    positions = ((scores - low) / (high - low)).to_numpy() if high > low else np.full(len(scores), 0.5)
    return _Axis(title, positions, _text(scores), [(0.0, f"{low:.4g}"), (1.0, f"{high:.4g}")])


def _text(values: pd.Series) -> np.ndarray:
    return np.char.mod("%.6g", values.astype(float).to_numpy()).astype(object)


def _polylines(name: str, positions: np.ndarray, values: np.ndarray, ids: np.ndarray,
               labels: list[str]) -> go.Scatter:
    """One trace for a group of trials: their polylines across the axes, separated by gaps (NaN: null)."""
    count, width = positions.shape
    x = np.tile(np.append(np.arange(width, dtype=float), np.nan), count)[:-1]  # no gap after the last
    y = np.hstack([positions, np.full((count, 1), np.nan)]).ravel()[:-1]
    customdata = np.column_stack([np.repeat(ids.astype(object), width + 1),
                                  np.hstack([values, np.full((count, 1), "", dtype=object)]).ravel()])[:-1]
    text = np.tile(np.array([*labels, ""], dtype=object), count)[:-1]
    return go.Scatter(x=x, y=y, customdata=customdata, text=text, mode="lines", name=name, **LINES[name],
                      hovertemplate="%{text}: %{customdata[1]}<br>trial %{customdata[0]}"
                                    f"<extra>{name}</extra>")


def _mark(x: int, y: float, text: str) -> dict[str, Any]:
    """A small label at an axis: under its bottom end, over its top end, beside it in between."""
    placed = ({"yanchor": "top"} if y == 0.0 else {"yanchor": "bottom"} if y == 1.0
              else {"xanchor": "left", "xshift": 4})
    return {"x": x, "y": y, "text": text, "showarrow": False, "font": {"size": 10, "color": "#444"}, **placed}
