"""The database: the project's tables beside Optuna's, and what is written and read there. One module a job:

- `storage`: `Storage`, one deployment's database as one object; the CLI and the API go through it.
- `schema`: the project's own tables; `engine`: engines, sessions, Optuna's storage on the same database and the
  Alembic migrations (`migrations/`) that bring the schema up to date.
- `ledger`: each trial's state and value, written beside Optuna's at every transition.
- `lifecycle`: cancel a study, put it back in the queue, delete it with its artifacts.
- `claims`: who runs a study changes by compare and set, so that of two processes claiming it one wins.
- `file_identity`: a SQLite file deleted or replaced under a running process is refused, not written to.
- `tokens`: API bearer tokens and whether the API needs them.
- `studies`, `trials`: the read models of studies and trials, queried in SQL; `views`: those read models, plain
  frozen data; `documents`: the same as JSON documents, what `tuner status --json` prints and the REST API returns.
- `progress`: how far a study is, pure functions of counts; `progress_queries`: those counts, in SQL.
- `optuna_internals`: Optuna's private parts the queries rely on, in one place; `optuna_names`: how a study's Optuna
  studies are named (one per family, its later stages below it) and which of them exist.

Code outside the store imports the names below from `lm_tuner.tuner.store` (each is loaded on first use, so that
importing one module of the store does not load them all). The run (`tuner.run`), which works in processes Ray
starts and is handed a URL rather than a `Storage`, and the analysis (`tuner.analysis`), which queries the tables
itself, use the modules directly.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={  # each name's module in this package
    "storage": ["Storage"],
    "documents": ["StudyOut", "StudyDetailOut", "TrialOut", "BaselineOut"],
    "views": ["StudyView", "TrialView", "Page", "TRIAL_STATES"],
    "progress": ["StudyProgress"],
    "lifecycle": ["StudyStateError"],
    "file_identity": ["DatabaseReplaced"],
    "tokens": ["TokenError"],
    "schema": ["TrialRecord", "TurnRecord", "STUDY_STATUSES"],
    "studies": ["study_artifacts", "in_study_store"],
    "trials": ["top_trials"],
})
