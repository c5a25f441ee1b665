"""The private parts of Optuna this project relies on, in one place (supported: the `optuna` range pinned in
pyproject.toml; tests/test_private_internals.py fails loudly when a release changes any of them).

- Optuna's table definitions (`optuna.storages._rdb.models`): queries join Optuna's trials, parameters and user
  attributes with the project's tables in SQL, so a page of a study of thousands of trials never loads the
  study through Optuna's API.
- A frozen trial's or study's storage id (`_trial_id`, `_study_id`), which Optuna's public API does not expose
  but its storages key everything by.
"""

from optuna.storages._rdb import models as optuna_models
from optuna.storages._rdb.models import StudyModel, TrialModel, TrialParamModel, TrialUserAttributeModel
from optuna.study._frozen import FrozenStudy
from optuna.trial import FrozenTrial

TRIALS = TrialModel.__table__
PARAMS = TrialParamModel.__table__
USER_ATTRIBUTES = TrialUserAttributeModel.__table__


def storage_trial_id(trial: FrozenTrial) -> int:
    """The id a storage knows `trial` by (its number counts within one study only)."""
    return trial._trial_id


def storage_study_id(study: FrozenStudy) -> int:
    """The id a storage knows `study` by, from `storage.get_all_studies()`."""
    return study._study_id


__all__ = ["PARAMS", "TRIALS", "USER_ATTRIBUTES", "StudyModel", "TrialModel", "TrialParamModel",
           "TrialUserAttributeModel", "optuna_models", "storage_study_id", "storage_trial_id"]
