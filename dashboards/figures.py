"""Plot builders: pure functions from a data frame of trials to a plotly figure."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

FAMILY_COLOURS = {"lstm": "#1f77b4", "mogrifier": "#d62728"}
FALLBACK_COLOURS = ("#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def family_colour(family: str, position: int = 0) -> str:
    return FAMILY_COLOURS.get(family, FALLBACK_COLOURS[position % len(FALLBACK_COLOURS)])


def non_dominated(frame: pd.DataFrame, x: str, y: str) -> pd.Series:
    """True for rows that no other row beats on both columns (both minimised)."""
    xs, ys = frame[x].to_numpy(), frame[y].to_numpy()
    flags = []
    for xi, yi in zip(xs, ys, strict=True):
        dominated = ((xs <= xi) & (ys <= yi) & ((xs < xi) | (ys < yi))).any()
        flags.append(not dominated)
    return pd.Series(flags, index=frame.index, dtype=bool)


# Plain lists (not numpy arrays) keep the figure JSON free of plotly's base64 typed arrays,
# so API clients other than plotly.js can read it.
def pareto_figure(trials: pd.DataFrame, *, x: str = "parameter_count", y: str = "perplexity",
                  x_title: str = "trainable parameters", y_title: str = "validation perplexity") -> go.Figure:
    """One marker colour per family; the non-dominated trials are ringed and joined by a step line.

    `trials` needs columns family, number, trial_id and the two plotted columns; rows with a
    missing value (unfinished, pruned or failed trials) are left out.
    """
    finished = trials.dropna(subset=[x, y])
    figure = go.Figure()
    for position, (family, group) in enumerate(finished.groupby("family", sort=True)):
        figure.add_trace(go.Scatter(
            x=group[x].tolist(), y=group[y].tolist(), mode="markers", name=family,
            marker={"color": family_colour(family, position), "size": 9},
            customdata=group[["trial_id", "number"]].to_numpy().tolist(),
            hovertemplate=f"{family} #%{{customdata[1]}}<br>{y_title} %{{y:.3f}}<br>{x_title} %{{x:,}}"
                          "<extra></extra>",
        ))
    if not finished.empty:
        front = finished[non_dominated(finished, x, y)].sort_values([x, y])
        figure.add_trace(go.Scatter(
            x=front[x].tolist(), y=front[y].tolist(), mode="lines+markers", name="non-dominated",
            line={"shape": "hv", "color": "#444", "dash": "dot"},
            marker={"symbol": "circle-open", "size": 16, "color": "#444", "line": {"width": 2}},
            customdata=front[["trial_id", "number", "family"]].to_numpy().tolist(),
            hovertemplate="non-dominated: %{customdata[2]} #%{customdata[1]}<extra></extra>",
        ))
    figure.update_layout(
        title="Pareto front: validation perplexity vs size", xaxis_title=x_title, yaxis_title=y_title,
        template="plotly_white", legend_title_text="family",
    )
    return figure
