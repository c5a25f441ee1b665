"""Study specs, the tuning controller (Optuna + Ray Tune), persistence, the queue and the CLI."""
