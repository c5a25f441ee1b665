"""Optuna's own table definitions, the one private Optuna internal this project reads (`optuna.storages._rdb`).

Queries join Optuna's trials, parameters and user attributes with the project's tables in SQL, so a page of a
study of thousands of trials never loads the study through Optuna's API. The supported Optuna versions are pinned
in pyproject.toml; tests/test_private_internals.py fails loudly when a release changes these tables.
"""

from optuna.storages._rdb import models as optuna_models
from optuna.storages._rdb.models import StudyModel, TrialModel, TrialParamModel, TrialUserAttributeModel

TRIALS = TrialModel.__table__
PARAMS = TrialParamModel.__table__
USER_ATTRIBUTES = TrialUserAttributeModel.__table__

__all__ = ["PARAMS", "TRIALS", "USER_ATTRIBUTES", "StudyModel", "TrialModel", "TrialParamModel",
           "TrialUserAttributeModel", "optuna_models"]
