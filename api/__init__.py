"""The FastAPI service: studies, trials, Pareto figures, checkpoints and the dashboard pages."""
