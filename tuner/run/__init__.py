"""Running a study: the controller (`controller`) tunes each family on Ray Tune (`experiment`, `trial`,
`search`, `strategies`), records what trials report (`recorder`), runs the later stages (`stages`,
`evaluation_jobs`) and stops cleanly (`cancellation`, `processes`); `queue` holds studies submitted over REST
for a worker to run, and `sensitivity` re-trains a best configuration with one hyperparameter moved.
"""
