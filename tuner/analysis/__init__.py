"""What a study's trials say, read from the database. One module a job:

- `comparison`: the families compared at equal budget, the study's result table and verdict.
- `family_tallies`: each family's trials per stage and the reruns it is owed, counted in one query.
- `study_facts`: what a report says beside the numbers (provisional or not, which validation set, the unigram
  baseline of the corpus).
- `sensitivity`: what the measured sensitivity runs found (`tuner.run.sensitivity` queues and trains them).
- `study_frames`: the aggregates the dashboard's figures plot, one call per figure.
- `trial_frames`: trials as pandas frames: the Pareto front's inputs and the table `tuner export` writes.
- `tuning_curves`: how good each family's best validation loss gets after n tuning trials; `curve_bands`: the
  confidence band of its median best, with the weights that cost a simulation kept on disk.

Code outside imports the modules themselves (`from lm_tuner.tuner.analysis.comparison import comparison`): this
package re-exports nothing, because `comparison` pulls Ray (through `tuner.run.stages`), `tuning_curves` opda and
`study_frames` scikit-learn, seconds that `tuner --help` and every command would pay, and because the main
functions share their modules' names (`comparison`, `tuning_curves`, `family_tallies`), which a lazy re-export
cannot serve reliably.
"""
