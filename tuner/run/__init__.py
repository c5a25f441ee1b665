"""Running a study, on Ray Tune. One module a job:

- `controller`: turns a validated spec into Optuna studies and runs their stages in order.
- `tuning`: the tuning stage, every family's remaining trials in one Ray Tune run.
- `experiment`: how a Ray Tune run over Optuna studies is set up (tuning, reruns, stage 2).
- `interleaving`: several families' studies in one Ray Tune run, trials proposed in turn.
- `trial`: one trial as a Ray Tune trainable; `reporting`: what it reports each turn, under which names.
- `search`: Ray Tune's OptunaSearch, made to record trials honestly (adapter of its private state).
- `strategies`: the Optuna samplers and Ray Tune schedulers that propose and stop trials.
- `registration`: what is recorded about a trial when it is proposed (stage, lineage, seed, model size).
- `recorder`: the Ray Tune callback that writes what trials report to the database.
- `stages`: after tuning: reruns, whole-split rescoring, the test protocol, stage 2; `evaluation_jobs`: that
  evaluation work as it runs on Ray workers.
- `sensitivity`: queuing and training the measured-sensitivity runs (`tuner.analysis.sensitivity` reads them).
- `queue`: studies submitted over REST, and the worker loop that runs them one at a time.
- `cancellation`: how a running controller notices a cancelled study; `processes`: signals become one orderly stop.
- `probe`: the few real training steps behind `tuner plan`'s time estimates.
- `ray_quiet`: Ray's and Tune's console output off for a launch (adapter of a private Ray logger).

This package re-exports nothing: most of its modules import Ray, which costs seconds, so outside code imports the
module it needs (`from lm_tuner.tuner.run.controller import ...`) and only pays for Ray where it runs something.
"""
