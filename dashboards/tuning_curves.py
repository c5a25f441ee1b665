"""Tuning curves: per family, the expected best score after n trials as a line, the median best's confidence
band shaded around it, and the verdict in words under the plot."""

from __future__ import annotations

import textwrap

import numpy as np
import plotly.graph_objects as go

from lm_tuner.dashboards.figures import family_colour, styled
from lm_tuner.tuner.analysis.tuning_curves import TuningCurves

VERDICT_WIDTH = 110  # characters a line of the verdict holds under the plot


def tuning_curves_figure(found: TuningCurves) -> go.Figure:
    """Scores in the study's unit; families coloured by their order in the study."""
    confidence, figure, shown = found.confidence, go.Figure(), []
    for position, curve in enumerate(_in_unit(found)):
        colour = family_colour(position)
        n, lower, upper = (np.asarray(curve[key], dtype=float) for key in ("n", "lower", "upper"))
        bounded = np.isfinite(upper)
        figure.add_trace(go.Scatter(
            x=np.concatenate([n[bounded], n[bounded][::-1]]),
            y=np.concatenate([upper[bounded], lower[bounded][::-1]]), fill="toself", fillcolor=colour,
            opacity=0.18, line={"width": 0}, name=f"{curve['family']} {confidence * 100:g}% band (median best)",
            hoverinfo="skip", legendgroup=curve["family"]))
        figure.add_trace(go.Scatter(
            x=n, y=np.asarray(curve["expected"], dtype=float), mode="lines+markers", name=curve["family"],
            line={"color": colour}, marker={"size": 5}, legendgroup=curve["family"],
            customdata=np.column_stack([curve["median"], lower, upper]) if len(n) else None,
            hovertemplate=f"{curve['family']}, n=%{{x}}: expected best %{{y:.3f}}, median %{{customdata[0]:.3f}} "
                          "[%{customdata[1]:.3f}, %{customdata[2]:.3f}]<extra></extra>"))
        shown.extend(curve["expected"])
    wrapped = "<br>".join(textwrap.wrap(found.verdict, VERDICT_WIDTH))
    figure = styled(figure, "Tuning curves: expected best score after n trials", "trials (n)", found.unit.title,
                    legend_title_text="family", margin={"l": 70, "r": 20, "t": 50, "b": 110},
                    annotations=[{"text": wrapped, "xref": "paper", "yref": "paper", "x": 0, "y": -0.2,
                                  "xanchor": "left", "yanchor": "top", "showarrow": False, "align": "left"}])
    if shown:  # the band's trivial lower end (a perfect score) would flatten the curves
        low, high = min(shown), max(shown)
        pad = 0.15 * (high - low or abs(high) or 1.0)
        figure.update_yaxes(range=[low - pad, high + 3 * pad])
    return figure


def _in_unit(found: TuningCurves) -> list[dict]:
    """Per family: n, the expected and median best, the band (upper inf where unbounded), in the study's unit."""
    convert = found.unit.convert
    return [{"family": c.family, "n": [p.n for p in c.points], "expected": c.expected_best_scores,
             "median": convert([p.median_best for p in c.points]), "lower": convert([p.lower for p in c.points]),
             "upper": convert([p.upper for p in c.points])} for c in found.families]
