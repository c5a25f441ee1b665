"""Figures (pure functions: data frame in, plotly figure out) and the HTML pages of the dashboard."""

from lm_tuner.dashboards.budget_curves import budget_curves_figure
from lm_tuner.dashboards.curves import averaging_switches, curves_figure
from lm_tuner.dashboards.figures import figure_json, non_dominated, pareto_figure
from lm_tuner.dashboards.history import history_figure
from lm_tuner.dashboards.importance import importance_figure
from lm_tuner.dashboards.pages import PLOTLY_JS, render, static_path
from lm_tuner.dashboards.parallel import Range, neighbourhood, parallel_figure
from lm_tuner.dashboards.sensitivity import sensitivity_figure

__all__ = ["PLOTLY_JS", "Range", "averaging_switches", "budget_curves_figure", "curves_figure", "figure_json",
           "history_figure", "importance_figure", "neighbourhood", "non_dominated", "parallel_figure", "pareto_figure",
           "render", "sensitivity_figure", "static_path"]
