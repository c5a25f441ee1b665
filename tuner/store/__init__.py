"""The database: the project's tables beside Optuna's, and what is written and read there. One module a job:

- `storage`: `Storage`, one deployment's database as one object; the CLI and the API go through it.
- `schema`: the project's own tables; `engine`: engines, sessions, Optuna's storage on the same database and the
  Alembic migrations (`migrations/`) that bring the schema up to date.
- `ledger`: each trial's state and value, written beside Optuna's at every transition.
- `lifecycle`: cancel a study, put it back in the queue, delete it with its artifacts.
- `tokens`: API bearer tokens and whether the API needs them.
- `studies`, `trials`: the read models of studies and trials, queried in SQL; `views`: those read models, plain
  frozen data; `documents`: the same as JSON documents, what `tuner status --json` prints and the REST API returns.
- `progress`: how far a study is, pure functions of counts; `progress_queries`: those counts, in SQL.
- `optuna_internals`: Optuna's private parts the queries rely on, in one place.

Code outside the store imports the names below from `lm_tuner.tuner.store` (each is loaded on first use, so that
importing one module of the store does not load them all). The run (`tuner.run`), which works in processes Ray
starts and is handed a URL rather than a `Storage`, and the analysis (`tuner.analysis`), which queries the tables
itself, use the modules directly.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {  # name: the module of this package that defines it
    "Storage": "storage",
    "StudyOut": "documents", "StudyDetailOut": "documents", "TrialOut": "documents", "BaselineOut": "documents",
    "StudyView": "views", "TrialView": "views", "Page": "views", "TRIAL_STATES": "views",
    "StudyProgress": "progress",
    "StudyStateError": "lifecycle", "TokenError": "tokens",
    "TrialRecord": "schema", "TurnRecord": "schema", "STUDY_STATUSES": "schema",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
