"""The `tuner` command line: the outermost layer (the commands are `tuner.cli.app`'s). Only `tuner serve` imports
the web application."""

import os
import signal
import sys

# Before numpy/torch load: one OpenMP thread keeps GP suggestions fast (trials set their own threads).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    """The `tuner` executable. SIGINT stops it from the first instant, before the commands' imports (1-3 s): set
    explicitly, since a command started in the background of a script inherits it ignored, and a launch would run
    its whole study after a stop sent that early. Stopped there, nothing has started: the exit is quiet, 130."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        from lm_tuner.tuner.cli.app import main as run_command
    except KeyboardInterrupt:
        sys.exit(128 + signal.SIGINT)
    run_command()
