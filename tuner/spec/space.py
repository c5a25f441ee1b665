"""From a spec to what Optuna samples, and from sampled values to the configs a trial trains."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from lm_tuner.models import ModelConfig, solve_hidden_size
from lm_tuner.trainers import TrainingConfig
from lm_tuner.tuner.spec.document import DYNAMIC_EVALUATION_KINDS, DynamicEvaluationStage, SearchRange, StudySpec
from lm_tuner.tuner.spec.hyperparameters import HYPERPARAMETERS

MODEL_FIELDS = frozenset(ModelConfig.__dataclass_fields__)


@dataclass(frozen=True)
class TrialSetup:
    model: ModelConfig
    training: TrainingConfig


def distributions(spec: StudySpec, family: str) -> dict[str, BaseDistribution]:
    """The Optuna search space of one family's study."""
    return {name: _distribution(declared, HYPERPARAMETERS[name].kind)
            for name, declared in spec.searched_for(family).items()}


def dynamic_evaluation_distributions(stage: DynamicEvaluationStage) -> dict[str, BaseDistribution]:
    """The Optuna search space of a stage-2 study."""
    return {name: _distribution(declared, DYNAMIC_EVALUATION_KINDS[name])
            for name, declared in stage.search_space.items()}


def _distribution(declared: SearchRange, kind: str) -> BaseDistribution:
    if declared.choices is not None:
        return CategoricalDistribution(declared.choices)
    if kind == "int":
        return IntDistribution(int(declared.low), int(declared.high), log=declared.log)
    return FloatDistribution(declared.low, declared.high, log=declared.log)


def trial_setup(spec: StudySpec, family: str, params: dict[str, Any], vocab_size: int, seed: int) -> TrialSetup:
    """The model (solved to the parameter budget) and training configuration of one trial."""
    values = {**spec.fixed_for(family), **params}
    model_values, training_values = {}, {}
    for name, value in values.items():
        hyper = HYPERPARAMETERS[name]
        value = int(value) if hyper.kind == "int" else value
        (model_values if hyper.target == "model" else training_values)[name] = value
    options = tuple((name, model_values.pop(name)) for name in list(model_values) if name not in MODEL_FIELDS)
    shape = ModelConfig(vocab_size=vocab_size, hidden_size=1, family=family, options=options, **model_values)
    model = solve_hidden_size(shape, spec.parameter_budget)
    training = TrainingConfig(schedule=spec.training, seed=seed, **training_values)
    return TrialSetup(model, training)


def trial_seed(spec: StudySpec, trial_number: int) -> int:
    """The training seed of tuning trial `trial_number`."""
    return spec.tuning.seed + trial_number


RERUN_SEED_OFFSET = 1_000_000


def rerun_seed(spec: StudySpec, repeat: int) -> int:
    """The seed of repeat `repeat` of every rerun configuration, the same in every family (so that the final models
    the families are compared on differ only in their configurations): never one a tuning trial used."""
    return spec.tuning.seed + RERUN_SEED_OFFSET * (repeat + 1)


def initial_points(spec: StudySpec, family: str) -> list[dict[str, Any]]:
    """The spec's initial points restricted to what this family searches (empty points dropped), then the family's
    published configuration where `tuning.priors` is on (tuner.spec.priors)."""
    from lm_tuner.tuner.spec.priors import prior_points  # it imports this module's users (feasibility)

    searched = spec.searched_for(family)
    points = [{name: value for name, value in point.items() if name in searched}
              for point in spec.tuning.initial_points]
    return [point for point in points if point] + prior_points(spec, family)


