"""Optimisation history: every tuning trial's score in trial order, the best-so-far line per family.

Pruned trials are drawn at their last reported score (open triangles), failed trials as crosses along
the top of the plot, so neither is hidden.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from lm_tuner.dashboards.figures import family_colour, styled, whole_number_ticks


def best_so_far(scores: pd.Series) -> pd.Series:
    """Running minimum over complete trials (NaN before the first one); `scores` in trial order."""
    return scores.cummin()


def history_figure(trials: pd.DataFrame, y_title: str) -> go.Figure:
    """`trials`: family, number, trial_id, state, score (complete trials), last_score (pruned), fail_reason."""
    figure = go.Figure()
    finished = trials["score"].dropna()
    failed_y = float(max(finished.max(), trials["last_score"].max())) if not finished.empty else 1.0
    for position, (family, group) in enumerate(trials.sort_values("number").groupby("family", sort=True)):
        colour = family_colour(position)
        complete = group[group["state"] == "COMPLETE"]
        figure.add_trace(go.Scatter(  # SVG: in headless Chromium faster than WebGL at thousands of points
            x=complete["number"].to_numpy(), y=complete["score"].to_numpy(), mode="markers", name=family,
            legendgroup=family, marker={"color": colour, "size": 6, "opacity": 0.6},
            customdata=complete["trial_id"].to_numpy(),
            hovertemplate=f"{family} #%{{x}}<br>%{{y:.3f}}<extra>trial %{{customdata}}</extra>"))
        running = best_so_far(complete["score"])
        steps = complete[running.diff().fillna(-1) < 0]  # only where the best improves: a step line
        if not steps.empty:
            x = np.append(steps["number"].to_numpy(), group["number"].max())
            y = np.append(running[steps.index].to_numpy(), running.iloc[-1])
            figure.add_trace(go.Scatter(
                x=x, y=y, mode="lines", name=f"{family} best so far", legendgroup=family,
                line={"color": colour, "shape": "hv", "width": 2.5}, hovertemplate="best %{y:.3f}<extra></extra>"))
        pruned = group[group["state"] == "PRUNED"].dropna(subset=["last_score"])
        if not pruned.empty:
            figure.add_trace(go.Scatter(
                x=pruned["number"].to_numpy(), y=pruned["last_score"].to_numpy(), mode="markers",
                name=f"{family} pruned", legendgroup=family,
                marker={"color": colour, "symbol": "triangle-up-open", "size": 8},
                hovertemplate=f"{family} #%{{x}} pruned at %{{y:.3f}}<extra></extra>"))
        failed = group[group["state"] == "FAIL"]
        if not failed.empty:
            figure.add_trace(go.Scatter(
                x=failed["number"].to_numpy(), y=np.full(len(failed), failed_y), mode="markers",
                name=f"{family} failed", legendgroup=family, marker={"color": "#cf222e", "symbol": "x", "size": 8},
                customdata=failed["fail_reason"].fillna("").to_numpy(),
                hovertemplate=f"{family} #%{{x}} failed: %{{customdata}}<extra></extra>"))
    running = int((trials["state"] == "RUNNING").sum())
    empty = "No tuning trial has finished yet" + (f" ({running} running)." if running else ".")
    last = int(trials["number"].max()) if len(trials) else 1
    # half a trial of room at both ends: a marker at trial 0 on the axis's edge showed only its right half
    return styled(figure, "Optimisation history", "trial number (per family)", y_title, empty=empty,
                  x_axis={**whole_number_ticks(last), "range": [-0.5, last + 0.5]})
