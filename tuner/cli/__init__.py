"""The `tuner` command line: the outermost layer. Only `tuner serve` imports the web application."""

import os

# Before numpy/torch load: one OpenMP thread keeps GP suggestions fast (trials set their own threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from lm_tuner.tuner.cli.app import app, main  # noqa: E402

__all__ = ["app", "main"]
