"""Plot builders: pure functions from a data frame of trials to a plotly figure."""

from __future__ import annotations

import base64
import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def family_colour(position: int) -> str:
    """The colour of the family at `position` in its study's list: by order, so any family, a plugin's too, gets
    one, and the same study always draws the same family in the same colour."""
    return PALETTE[position % len(PALETTE)]


def figure_json(figure: go.Figure) -> dict[str, Any]:
    """The figure as plain JSON data with arrays as lists and NaN as null: plotly encodes numeric arrays as
    base64 typed arrays, which only plotly.js reads. (Figures are built from numpy arrays because plotly
    validates those far faster than lists.)"""
    return _plain(figure.to_plotly_json())


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return _listed(value)
    if isinstance(value, dict) and "bdata" in value and "dtype" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        if "shape" in value:
            array = array.reshape([int(size) for size in str(value["shape"]).split(",")])
        return _listed(array)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value


def _listed(array: np.ndarray) -> list:
    """As nested lists, with NaN and infinities as null (a gap to plotly; JSON has no NaN)."""
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return _plain(array.astype(object).tolist())
    return array.tolist()


def non_dominated(frame: pd.DataFrame, x: str, y: str) -> pd.Series:
    """True for rows that no other row beats on both columns (both minimised); O(n log n).

    Scanning in order of x (then y), a row is non-dominated when its y is below every y seen so far,
    or when it repeats the last front point exactly (identical points do not dominate each other).
    """
    xs, ys = frame[x].to_numpy(), frame[y].to_numpy()
    flags = np.zeros(len(frame), dtype=bool)
    best_y, best_x = np.inf, None
    for row in np.lexsort((ys, xs)):
        if ys[row] < best_y or (ys[row] == best_y and xs[row] == best_x):
            flags[row] = True
            best_y, best_x = ys[row], xs[row]
    return pd.Series(flags, index=frame.index, dtype=bool)


def pareto_figure(trials: pd.DataFrame, *, x: str = "compute_seconds", y: str = "perplexity",
                  x_title: str = "compute (device-seconds)", y_title: str = "validation perplexity") -> go.Figure:
    """One marker colour per family; the non-dominated trials are ringed and joined by a step line. The default
    cost is compute: an equal-budget study holds parameters constant by design, so they would show nothing.

    `trials` needs columns family, number, trial_id and the two plotted columns; rows with a
    missing value (unfinished, pruned or failed trials, or trials that ran before their cost was recorded) are left
    out, and the title says so where that leaves none.
    """
    finished = trials.dropna(subset=[x, y])
    figure = go.Figure()
    for position, (family, group) in enumerate(finished.groupby("family", sort=True)):
        figure.add_trace(go.Scatter(
            x=group[x].to_numpy(), y=group[y].to_numpy(), mode="markers", name=family,
            marker={"color": family_colour(position), "size": 9},
            customdata=group[["trial_id", "number"]].to_numpy(),
            hovertemplate=f"{family} #%{{customdata[1]}}<br>{y_title} %{{y:.3f}}<br>{x_title} %{{x:,}}"
                          "<extra></extra>",
        ))
    if not finished.empty:
        front = finished[non_dominated(finished, x, y)].sort_values([x, y])
        figure.add_trace(go.Scatter(
            x=front[x].to_numpy(), y=front[y].to_numpy(), mode="lines+markers", name="non-dominated",
            line={"shape": "hv", "color": "#444", "dash": "dot"},
            marker={"symbol": "circle-open", "size": 16, "color": "#444", "line": {"width": 2}},
            customdata=front[["trial_id", "number", "family"]].to_numpy(),
            hovertemplate="non-dominated: %{customdata[2]} #%{customdata[1]}<extra></extra>",
        ))
    title = f"Pareto front: {y_title} vs {x_title}"
    if finished.empty and not trials.dropna(subset=[y]).empty:
        title += f" (no finished trial has its {x_title} recorded: choose another cost)"
    return styled(figure, title, x_title, y_title, legend_title_text="family")


NOTHING_YET = "Nothing to draw yet."


def styled(figure: go.Figure, title: str, x_title: str, y_title: str, *, empty: str = NOTHING_YET,
           x_axis: Mapping[str, Any] | None = None, **layout: Any) -> go.Figure:
    """The dashboard's look, set by hand: expanding a named plotly template costs more than the data. The
    layout is built whole and assigned (update_layout validates key by key, three times slower).

    A figure that draws nothing says why in words (`empty`) instead of showing bare axes; `x_axis`: settings added
    to the x-axis (`whole_number_ticks` for counts)."""
    grid = {"gridcolor": "#e5e5e5", "zeroline": False, "automargin": True}
    xaxis, yaxis = {"title": {"text": x_title}, **grid, **(x_axis or {})}, {"title": {"text": y_title}, **grid}
    if not any(_has_points(trace) for trace in figure.data):
        xaxis = yaxis = {"visible": False}
        layout = {**layout, "showlegend": False, "annotations": [{
            "text": empty, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "showarrow": False,
            "font": {"size": 15, "color": "#666"}}]}
    figure.layout = go.Layout(
        title=title, xaxis=xaxis, yaxis=yaxis,
        template="none", paper_bgcolor="white", plot_bgcolor="white", font={"family": "system-ui, sans-serif"},
        **{"margin": {"l": 70, "r": 20, "t": 50, "b": 55}, **layout},
    )
    return figure


def whole_number_ticks(largest: float, ticks: int = 8) -> dict[str, Any]:
    """Axis settings for a count (trials, turns): ticks on whole numbers only, 1, 2, 5, 10, 20, ... apart, at most
    about `ticks` of them up to `largest` (plotly's own choice puts them at 0.2 or 1.5 on a short axis)."""
    step, factors = 1, itertools.cycle((2, 2.5, 2))
    while largest / step > ticks:
        step = round(step * next(factors))
    return {"tick0": 0, "dtick": step, "rangemode": "nonnegative"}


def _has_points(trace: Any) -> bool:
    return any(values is not None and len(values) > 0 for values in (trace.x, trace.y))
