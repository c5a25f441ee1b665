"""Measured sensitivity: validation score against the value one hyperparameter was moved to, mean ± std
over seeds per value, every run shown, the best configuration's value marked."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from lm_tuner.dashboards.figures import family_colour, styled


def sensitivity_figure(runs: pd.DataFrame, effect: pd.DataFrame, parameter: str, y_title: str,
                       best_value: float | None, log: bool) -> go.Figure:
    """`runs`: family, value, score (one row per run); `effect`: family, value, mean, std, count."""
    figure = go.Figure()
    for position, (family, group) in enumerate(effect.groupby("family", sort=True)):
        colour = family_colour(position)
        single = runs[(runs["family"] == family)].dropna(subset=["score"])
        figure.add_trace(go.Scatter(
            x=single["value"].to_numpy(), y=single["score"].to_numpy(), mode="markers", name=f"{family} runs",
            marker={"color": colour, "size": 6, "opacity": 0.35}, hovertemplate="%{x:.4g}: %{y:.3f}<extra></extra>"))
        figure.add_trace(go.Scatter(
            x=group["value"].to_numpy(), y=group["mean"].to_numpy(), mode="lines+markers", name=f"{family} mean ± std",
            line={"color": colour}, marker={"size": 9},
            error_y={"type": "data", "array": group["std"].to_numpy(), "visible": True, "color": colour},
            customdata=group[["std", "count"]].to_numpy(),
            hovertemplate="%{x:.4g}: %{y:.3f} ± %{customdata[0]:.3f} (%{customdata[1]} runs)<extra></extra>"))
    if best_value is not None and not runs["score"].dropna().empty:
        low, high = runs["score"].min(), runs["score"].max()
        figure.add_trace(go.Scatter(x=[best_value, best_value], y=[low, high], mode="lines", name="best configuration",
                                    line={"dash": "dash", "color": "#444"}, hoverinfo="skip"))
    figure = styled(figure, f"Measured effect of {parameter} (best ± 15% of its range)", parameter, y_title,
                    empty=f"No run of {parameter} measured yet.")
    return figure.update_xaxes(type="log" if log else "linear")
