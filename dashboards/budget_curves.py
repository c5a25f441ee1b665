"""Best-so-far curves against the budget: each family's best validation score as its tuning spent training tokens
(left) and device-seconds (right), in the order its turns were recorded, with the equal points marked."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go

from lm_tuner.dashboards.figures import family_colour, styled

AXES = (("tokens", "x", "training tokens spent by the family's tuning"),
        ("compute_seconds", "x2", "{compute_unit} spent by the family's tuning"))


def budget_curves_figure(curves: pd.DataFrame, *, families: list[str], rates: Mapping[str, float | None],
                         equal_tokens: float | None, equal_compute: float | None, compute_unit: str,
                         y_title: str) -> go.Figure:
    """`curves`: one row per tuning turn in the order recorded, with family, tokens and compute_seconds (the family's
    spend after that turn; NaN where not recorded) and score (its best so far; NaN before a first score). `rates`:
    each family's training tokens per device-second, shown in the legend. Families are coloured by their order in
    the study; a dotted line marks each equal point."""
    figure = go.Figure()
    per = compute_unit.removesuffix("s").replace("CPU ", "")
    for position, family in enumerate(families):
        group = curves[curves["family"] == family]
        rate = rates.get(family)
        name = family if rate is None else f"{family} ({rate:,.0f} tokens per {per})"
        for column, axis, _ in AXES:
            drawn = group.dropna(subset=[column, "score"])
            figure.add_trace(go.Scatter(
                x=drawn[column].to_numpy(), y=drawn["score"].to_numpy(), mode="lines+markers", name=name,
                legendgroup=family, showlegend=axis == "x", xaxis=axis, yaxis=axis.replace("x", "y"),
                line={"color": family_colour(position), "shape": "hv"}, marker={"size": 4},
                hovertemplate=f"{family}: best %{{y:.3f}} after %{{x:,.0f}}<extra></extra>"))
    marks = [(point, axis, label) for point, axis, label in ((equal_tokens, "x", "equal tokens"),
                                                             (equal_compute, "x2", "equal compute"))
             if point is not None]
    grid = {"gridcolor": "#e5e5e5", "zeroline": False, "automargin": True}
    title = "Best so far at equal budgets"
    if curves.dropna(subset=["score"]).empty:
        title += ": no tuning turn has reported a score with its tokens and compute yet"
    figure = styled(
        figure, title, AXES[0][2], y_title, legend_title_text="family",
        xaxis2={"title": {"text": AXES[1][2].format(compute_unit=compute_unit)}, "anchor": "y2", **grid},
        yaxis2={"anchor": "x2", "matches": "y", "showticklabels": False, **grid},
        shapes=[{"type": "line", "xref": axis, "yref": "paper", "x0": point, "x1": point, "y0": 0, "y1": 1,
                 "line": {"color": "#444", "dash": "dot", "width": 1}} for point, axis, _ in marks],
        annotations=[{"text": label, "xref": axis, "yref": "paper", "x": point, "y": 1, "yanchor": "bottom",
                      "showarrow": False, "font": {"size": 11}} for point, axis, label in marks])
    figure.layout.xaxis.domain, figure.layout.xaxis2.domain = (0, 0.47), (0.53, 1)
    return figure
