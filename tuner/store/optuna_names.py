"""How a study's Optuna studies are named: each family is tuned in its own Optuna study, so every family gets equal
trials, and its later stages are named below it (`name/family/reruns`, `name/family/dyneval/7`)."""

from sqlalchemy import select

from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.optuna_internals import StudyModel


def optuna_study_name(study: str, family: str, *stage: str) -> str:
    """The Optuna study of one family of `study`, or of one of that family's later stages."""
    return "/".join((study, family, *stage))


def optuna_studies_of(url: str, study: str) -> list[str]:
    """The names of every Optuna study of `study` in the database: its families' and their later stages'."""
    prefix = f"{study}/"  # study names hold no '/'
    with sessions(url)() as session:
        return list(session.scalars(select(StudyModel.study_name).where(
            StudyModel.study_name.startswith(prefix, autoescape=True))))  # `_` and `%` are LIKE wildcards
