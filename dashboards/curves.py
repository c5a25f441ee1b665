"""Learning curves of chosen trials, with the turns where weight averaging switched on (or restarted) marked."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from lm_tuner.dashboards.figures import PALETTE, styled, whole_number_ticks

CURVE_COLOURS = (*PALETTE, "#7f7f7f", "#bcbd22")


def averaging_switches(curve: pd.DataFrame) -> list[int]:
    """Turns where averaging switched: the averaged length rises above 1 (raw weights: 1, or unknown), or
    falls (an average restarted). `curve` has turn and averaging_length, one trial, in turn order."""
    lengths = curve["averaging_length"].fillna(1).clip(lower=1).to_numpy()
    turns = curve["turn"].to_numpy()
    previous = np.concatenate(([1], lengths[:-1]))
    switched = ((previous <= 1) & (lengths > 1)) | (lengths < previous)
    return [int(turn) for turn in turns[switched]]


def curves_figure(turns: pd.DataFrame, y_title: str) -> go.Figure:
    """`turns`: trial_id, family, stage, number, turn, train_score, val_score, averaging_length. One colour
    per trial: validation solid, training dotted, averaging switches as diamonds on the validation line."""
    figure = go.Figure()
    for position, (trial_id, curve) in enumerate(turns.groupby("trial_id", sort=False)):
        colour = CURVE_COLOURS[position % len(CURVE_COLOURS)]
        first = curve.iloc[0]
        label = f"{first['family']} #{first['number']}" + ("" if first["stage"] == "tune" else f" ({first['stage']})")
        group = f"trial-{trial_id}"
        figure.add_trace(go.Scatter(
            x=curve["turn"].to_numpy(), y=curve["val_score"].to_numpy(), mode="lines+markers", name=f"{label} valid",
            legendgroup=group, line={"color": colour}, marker={"size": 4},
            customdata=curve["averaging_length"].fillna(1).to_numpy(),
            hovertemplate="turn %{x}: %{y:.3f}<br>averaging %{customdata} iterates<extra>" + label + "</extra>"))
        figure.add_trace(go.Scatter(
            x=curve["turn"].to_numpy(), y=curve["train_score"].to_numpy(), mode="lines", name=f"{label} train",
            legendgroup=group, line={"color": colour, "dash": "dot", "width": 1}, hoverinfo="skip"))
        switches = averaging_switches(curve)
        if switches:
            at = curve.set_index("turn").loc[switches]
            figure.add_trace(go.Scatter(
                x=switches, y=at["val_score"].to_numpy(), mode="markers", name=f"{label} averaging switch",
                legendgroup=group, marker={"color": colour, "symbol": "diamond", "size": 12,
                                           "line": {"color": "black", "width": 1}},
                customdata=at["averaging_length"].to_numpy(),
                hovertemplate="averaging switched at turn %{x} (%{customdata} iterates)<extra>" + label + "</extra>"))
    return styled(figure, "Learning curves", "turn", y_title, empty="No trial has reported a turn yet.",
                  x_axis=whole_number_ticks(turns["turn"].max() if len(turns) else 1))
