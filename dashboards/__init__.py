"""Figures (pure functions: data frame in, plotly figure out) and the HTML pages of the dashboard."""

from dashboards.figures import figure_json, non_dominated, pareto_figure
from dashboards.pages import plotly_js_path, studies_page, study_page

__all__ = ["figure_json", "non_dominated", "pareto_figure", "plotly_js_path", "studies_page", "study_page"]
