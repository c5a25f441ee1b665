"""What a trial reports to Ray Tune each turn, and the names the searcher and schedulers read."""

OBJECTIVE = "best_val_loss"
"""The metric every trial reports and the study minimises: best validation cross-entropy so far."""

TURN = "turn"
"""The time axis of early stopping: completed turns."""

FAILED = "failed"
"""Result key carrying the reason a configuration failed (a result with it is the trial's last)."""

INFRASTRUCTURE = "infrastructure"
"""Result key, True on a failure report whose cause is the machine, not the configuration (the artifact store
refused a checkpoint: full, read-only): the trial is failed but not settled, and a resume runs it again."""
