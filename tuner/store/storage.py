"""`Storage`: one deployment's database as one object, what the CLI and the API read and change studies through.

The project's tables live beside Optuna's in the same database (SQLite or PostgreSQL), reached through
SQLAlchemy; every method is one query or one transaction of the modules of this package, keyed by the URL the
object holds. The controller and its trials use those modules directly: they run in other processes, which Ray
hands a URL, not an object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import optuna

from lm_tuner.tuner.settings import ArtifactRoot, masked_url
from lm_tuner.tuner.store import engine, lifecycle
from lm_tuner.tuner.store import studies as study_queries
from lm_tuner.tuner.store import tokens as token_table
from lm_tuner.tuner.store import trials as trial_queries
from lm_tuner.tuner.store.schema import ApiToken, TrialRecord, TurnRecord
from lm_tuner.tuner.store.views import Page, StudyView, TrialView

TrialSort = Literal["number", "value", "family", "state", "started"]


class Storage:
    def __init__(self, url: str) -> None:
        self.url = url

    def __repr__(self) -> str:
        return f"Storage({masked_url(self.url)!r})"

    # The schema
    def upgrade(self) -> None:
        """Create or migrate Optuna's and the project's tables (safe from several processes at once)."""
        engine.ensure_schema(self.url)

    def revision(self) -> str | None:
        return engine.current_revision(self.url)

    def optuna(self) -> optuna.storages.RDBStorage:
        return engine.optuna_storage(self.url)

    # Studies
    def studies(self, *, status: str | None = None, family: str | None = None, name_contains: str | None = None,
                limit: int | None = None, offset: int = 0) -> Page[StudyView]:
        return study_queries.list_studies(self.url, status=status, family=family, name_contains=name_contains,
                                    limit=limit, offset=offset)

    def study(self, name: str) -> StudyView | None:
        return study_queries.get_study(self.url, name)

    def warnings(self, name: str) -> list[str]:
        """What the study's run has warned about so far, oldest first."""
        return study_queries.stored_warnings(self.url, name)

    def study_exists(self, name: str) -> bool:
        return study_queries.study_exists(self.url, name)

    def families(self) -> list[str]:
        """The families of every study, for filters."""
        return study_queries.study_families(self.url)

    def best_trials(self, name: str) -> dict[str, TrialView | None] | None:
        return study_queries.best_trials(self.url, name)

    def artifact_root(self, name: str) -> ArtifactRoot | None:
        return study_queries.study_artifact_root(self.url, name)

    def cancel(self, name: str) -> str:
        return lifecycle.cancel_study(self.url, name)

    def resume(self, name: str) -> str:
        return lifecycle.resume_study(self.url, name)

    def delete(self, name: str, artifact_root: Path) -> None:
        lifecycle.delete_study(self.url, name, artifact_root)

    # Trials
    def trials(self, name: str, *, state: str | None = None, family: str | None = None, stage: str | None = None,
               sort: TrialSort = "number", descending: bool = False, limit: int | None = None,
               offset: int = 0) -> Page[TrialView]:
        return trial_queries.study_trials(self.url, name, state=state, family=family, stage=stage, sort=sort,
                                   descending=descending, limit=limit, offset=offset)

    def trial(self, trial_id: int) -> TrialView | None:
        return trial_queries.get_trial(self.url, trial_id)

    def trial_record(self, trial_id: int) -> TrialRecord | None:
        """The trial's own row (its outcome, as the recorder stored it), without the joins of `trial`."""
        with engine.sessions(self.url)() as session:
            return session.get(TrialRecord, trial_id)

    def learning_curve(self, trial_id: int) -> list[TurnRecord]:
        return trial_queries.learning_curve(self.url, trial_id)

    # API tokens and authentication
    def create_token(self, name: str, secret: str | None = None) -> str:
        return token_table.create_token(self.url, name, secret)

    def initial_token(self, name: str, secret: str | None = None) -> str | None:
        return token_table.initial_token(self.url, name, secret)

    def revoke_token(self, name: str) -> None:
        token_table.revoke_token(self.url, name)

    def list_tokens(self) -> list[ApiToken]:
        return token_table.list_tokens(self.url)

    def token_is_valid(self, token: str) -> bool:
        return token_table.token_is_valid(self.url, token)

    def auth_enabled(self) -> bool:
        return token_table.auth_enabled(self.url)

    def set_auth(self, enabled: bool) -> None:
        token_table.set_auth(self.url, enabled)
