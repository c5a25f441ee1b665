"""The `tuner` command line: the outermost layer. Only `tuner serve` imports the web application."""

from lm_tuner.tuner.cli.app import app, main

__all__ = ["app", "main"]
