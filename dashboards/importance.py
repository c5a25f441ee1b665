"""Hyperparameter importance (Optuna's evaluators), one bar per hyperparameter and family."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go

from lm_tuner.dashboards.figures import family_colour, styled


def importance_figure(importances: Mapping[str, Mapping[str, float]], evaluator: str) -> go.Figure:
    """`importances`: family -> hyperparameter -> normalised importance. Hyperparameters sorted by their
    largest importance in any family, most important at the top."""
    names = sorted({name for values in importances.values() for name in values},
                   key=lambda name: max(values.get(name, 0.0) for values in importances.values()))
    figure = go.Figure()
    for position, (family, values) in enumerate(sorted(importances.items())):
        figure.add_trace(go.Bar(
            y=names, x=np.array([values.get(name, np.nan) for name in names], dtype=float), orientation="h",
            name=family, marker={"color": family_colour(position)},
            hovertemplate=f"{family}: %{{y}} %{{x:.3f}}<extra></extra>"))
    return styled(figure, f"Hyperparameter importance ({evaluator})", "importance (sums to 1 per family)", "",
                  empty="Importance needs two complete tuning trials of a family: none has them yet.", barmode="group")
