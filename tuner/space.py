"""From a spec to what Optuna samples, and from sampled values to the configs a trial trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from models import ModelConfig, solve_hidden_size
from trainers import TrainingConfig
from tuner.hyperparameters import HYPERPARAMETERS
from tuner.spec import StudySpec


@dataclass(frozen=True)
class TrialSetup:
    model: ModelConfig
    training: TrainingConfig


def distributions(spec: StudySpec, family: str) -> dict[str, BaseDistribution]:
    """The Optuna search space of one family's study."""
    space: dict[str, BaseDistribution] = {}
    for name, declared in spec.searched_for(family).items():
        if declared.choices is not None:
            space[name] = CategoricalDistribution(declared.choices)
        elif HYPERPARAMETERS[name].kind == "int":
            space[name] = IntDistribution(int(declared.low), int(declared.high), log=declared.log)
        else:
            space[name] = FloatDistribution(declared.low, declared.high, log=declared.log)
    return space


def trial_setup(spec: StudySpec, family: str, params: dict[str, Any], vocab_size: int, trial_number: int) -> TrialSetup:
    """The model (solved to the parameter budget) and training configuration of one trial."""
    values = {**spec.fixed_for(family), **params}
    model_values, training_values = {}, {}
    for name, value in values.items():
        hyper = HYPERPARAMETERS[name]
        value = int(value) if hyper.kind == "int" else value
        (model_values if hyper.target == "model" else training_values)[name] = value
    shape = ModelConfig(vocab_size=vocab_size, hidden_size=1, family=family, **model_values)
    model = solve_hidden_size(shape, spec.parameter_budget)
    training = TrainingConfig(schedule=spec.training, seed=trial_seed(spec, trial_number), **training_values)
    return TrialSetup(model, training)


def trial_seed(spec: StudySpec, trial_number: int) -> int:
    return spec.tuning.seed + trial_number


def initial_points(spec: StudySpec, family: str) -> list[dict[str, Any]]:
    """The spec's initial points restricted to what this family searches (empty points dropped)."""
    searched = spec.searched_for(family)
    points = [{name: value for name, value in point.items() if name in searched}
              for point in spec.tuning.initial_points]
    return [point for point in points if point]


def optuna_study_name(study: str, family: str) -> str:
    """Each family of a study is tuned in its own Optuna study, so every family gets equal trials."""
    return f"{study}/{family}"
