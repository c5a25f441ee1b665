"""Tuning curves: per family, the expected best score after n trials as a line, the median best's confidence
band shaded around it, and the verdict in words under the plot."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import plotly.graph_objects as go

from lm_tuner.dashboards.figures import family_colour, styled, whole_number_ticks
from lm_tuner.tuner.analysis.tuning_curves import TuningCurves

VERDICT_WIDTH = 110  # characters a line of the verdict holds under the plot
OPEN_BAND = "A band that reaches the edge of the plot is open there: too few trials to bound it."
NO_CURVES = "No complete tuning trial yet: the curves start with the first."


def tuning_curves_figure(found: TuningCurves) -> go.Figure:
    """Scores in the study's unit; families coloured by their order in the study. The y-axis covers every curve
    and every bounded end of a band; an end the trials cannot bound (a perfect score below, none above) is drawn
    to the edge of the plot, and the note under it says so."""
    confidence, figure, families = found.confidence, go.Figure(), _in_unit(found)
    curves = [curve for curve in families if curve["n"]]
    bottom, top = _score_range(curves)
    for position, curve in enumerate(families):
        if not curve["n"]:
            continue
        colour = family_colour(position)
        n = np.asarray(curve["n"], dtype=float)
        lower = np.where(curve["lower_open"], bottom, curve["lower"])
        upper = np.where(curve["upper_open"], top, curve["upper"])
        x, y = _steps(n, lower, upper)
        figure.add_trace(go.Scatter(  # lines of width 0, not plotly's default markers on every corner
            x=x, y=y, mode="lines", fill="toself", fillcolor=colour, opacity=0.18, line={"width": 0},
            name=f"{curve['family']} {confidence * 100:g}% band (median best)", hoverinfo="skip",
            legendgroup=curve["family"]))
        figure.add_trace(go.Scatter(
            x=n, y=np.asarray(curve["expected"], dtype=float), mode="lines+markers", name=curve["family"],
            line={"color": colour}, marker={"size": 5, "color": colour}, legendgroup=curve["family"],
            customdata=np.column_stack([np.asarray(curve["median"], dtype=float).astype(object), _band_text(curve)]),
            hovertemplate=f"{curve['family']}, n=%{{x}}: expected best %{{y:.3f}}, median %{{customdata[0]:.3f}}, "
                          "band %{customdata[1]}<extra></extra>"))
    opened = any(any(curve["lower_open"]) or any(curve["upper_open"]) for curve in curves)
    note = "<br>".join([*textwrap.wrap(found.verdict, VERDICT_WIDTH), *([OPEN_BAND] if opened else [])])
    most = max((curve["n"][-1] for curve in curves), default=1)
    figure = styled(figure, "Tuning curves: expected best score after n trials", "trials (n)", found.unit.title,
                    empty=NO_CURVES, x_axis=whole_number_ticks(most), legend_title_text="family",
                    margin={"l": 70, "r": 20, "t": 50, "b": 110},
                    annotations=[{"text": note, "xref": "paper", "yref": "paper", "x": 0, "y": -0.2,
                                  "xanchor": "left", "yanchor": "top", "showarrow": False, "align": "left"}])
    if curves:
        figure.layout.yaxis.range = [bottom, top]
    return figure


def _in_unit(found: TuningCurves) -> list[dict]:
    """Per family: n, the expected and median best, the band, in the study's unit; which band ends are open (a
    lower end at a loss of 0, an infinite upper end: the trials cannot bound them)."""
    convert = found.unit.convert
    return [{"family": c.family, "n": [p.n for p in c.points], "expected": c.expected_best_scores,
             "median": convert([p.median_best for p in c.points]), "lower": convert([p.lower for p in c.points]),
             "upper": convert([p.upper for p in c.points]), "lower_open": [p.lower <= 0 for p in c.points],
             "upper_open": [not math.isfinite(p.upper) for p in c.points]} for c in found.families]


def _score_range(curves: list[dict]) -> tuple[float, float]:
    """The y-range that holds every curve and every bounded band end, with a margin; (0, 1) with nothing."""
    shown = [value for curve in curves for key in ("expected", "median") for value in curve[key]]
    shown += [value for curve in curves for end in ("lower", "upper")
              for value, opened in zip(curve[end], curve[f"{end}_open"], strict=True) if not opened]
    if not shown:
        return 0.0, 1.0
    low, high = min(shown), max(shown)
    pad = 0.08 * (high - low) or 0.05 * abs(high) or 1.0
    return low - pad, high + pad


def _steps(n: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The band as a polygon of steps: at each n, from n - 1/2 to n + 1/2 (a band at n = 1 alone is a block, not
    a line of no width), along the upper ends and back along the lower ones."""
    x = np.column_stack([n - 0.5, n + 0.5]).ravel()
    return np.concatenate([x, x[::-1]]), np.concatenate([np.repeat(upper, 2), np.repeat(lower, 2)[::-1]])


def _band_text(curve: dict) -> np.ndarray:
    ends = [(f"{low:.3f}" if not low_open else "open", f"{high:.3f}" if not high_open else "open")
            for low, high, low_open, high_open in zip(curve["lower"], curve["upper"], curve["lower_open"],
                                                      curve["upper_open"], strict=True)]
    return np.array([f"[{low}, {high}]" for low, high in ends], dtype=object)
