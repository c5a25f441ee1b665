"""How a study's Optuna studies are named: each family is tuned in its own Optuna study, so every family gets equal
trials, and its later stages are named below it (`name/family/reruns`, `name/family/dyneval/7`)."""


def optuna_study_name(study: str, family: str, *stage: str) -> str:
    """The Optuna study of one family of `study`, or of one of that family's later stages."""
    return "/".join((study, family, *stage))


def study_prefix(study: str) -> str:
    """What every Optuna study of `study` is named with first (study names hold no '/')."""
    return f"{study}/"
