"""The study specification: the one document (YAML or JSON) that describes a study, as typed objects.

`lm_tuner.tuner.spec.validation.parse_spec` builds a `StudySpec` from text; everything downstream receives the
validated object."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from lm_tuner.models import family_names
from lm_tuner.models.families import family_plugin_error
from lm_tuner.trainers import MC_MULTIPLIERS, DatasetConfig, Schedule
from lm_tuner.tuner.spec.hyperparameters import HYPERPARAMETERS
from lm_tuner.tuner.spec.units import is_character_level

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
RESERVED_NAMES = ("new",)  # /dashboard/studies/new is the page that starts a study
MAX_SPEC_BYTES = 256 * 1024  # a spec file, or a request body that carries one
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
"""Every integer of a spec fits the database's 32-bit Integer columns (seeds, counts, budgets, sizes)."""
MAX_TUNING_SEED = 2**30
"""Trial seeds add the trial number to the tuning seed, and rerun seeds 1,000,000 per repeat (tuner.space): at most
1,000,000 trials and 1,000 reruns keep every derived seed below 2**31."""


def _hyperparameter_value(value: Any) -> bool | int | float:
    """The value as given: a union would try each member in turn, and report three errors for one value."""
    if isinstance(value, bool | int | float):
        return value
    raise PydanticCustomError("hyperparameter_value", "must be a number or true/false")


HyperparameterValue = Annotated[bool | int | float,
                                PlainValidator(_hyperparameter_value, json_schema_input_type=bool | int | float)]


def _registered_family(name: str) -> str:
    """A family of the registry (models.families), in pydantic's words for a Literal, so messages read alike."""
    known = family_names()
    if name not in known:
        if (plugin_error := family_plugin_error(name)) is not None:
            raise plugin_error  # a ValueError: pydantic reports it at the family's line
        expected = " or ".join((", ".join(repr(family) for family in known[:-1]), repr(known[-1])))
        raise PydanticCustomError("family", "Input should be {expected}", {"expected": expected})
    return name


Family = Annotated[str, AfterValidator(_registered_family)]
"""The name of a registered model family."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SearchRange(_Strict):
    """The range of one searched hyperparameter: `low`/`high` (optionally `log`), or `choices`."""

    low: float | None = Field(None, description="lower bound, included")
    high: float | None = Field(None, description="upper bound, included")
    log: bool = Field(False, description="sample uniformly in log space (needs low > 0)")
    choices: list[HyperparameterValue] | None = Field(None, description="the values to choose from")
    families: list[Family] | None = Field(None, description="search it only for these families")


class Tuning(_Strict):
    sampler: Literal["gp", "tpe", "random", "qmc"] = Field("gp", description="Optuna sampler proposing trials")
    trials: int | None = Field(None, ge=1, le=1_000_000, description="trials per model family; with a "
                                                                     "compute_budget, its configurations per family "
                                                                     "(set from its rungs when left out)")
    startup_trials: int = Field(10, ge=1, description="random trials before the gp/tpe model proposes")
    concurrency: int = Field(1, ge=1, description="trials running at once, all families sharing the slots: "
                                                 "trials are proposed to the families in turn")
    seed: int = Field(0, ge=0, le=MAX_TUNING_SEED, description="seeds the sampler; trial k trains with seed + k")
    max_retries: int = Field(2, ge=0, description="restarts of a trial whose worker process or node died")
    initial_points: list[dict[str, HyperparameterValue]] = Field(
        default_factory=list, description="configurations tried first, in order (each family takes the "
                                          "hyperparameters it searches; the rest are sampled)")
    # Left out of the dump when off, so that a study stored before the field existed dumps as it was stored: a
    # relaunch continues a study only when its spec is identical.
    priors: bool = Field(False, exclude_if=lambda on: not on, description=(
        "try each family's published best configuration (deepmind/lamb) after initial_points: its dropout rates "
        "and L2 penalty scaled to this study's training and parameter budget, its values clipped into the searched "
        "ranges (docs/methodology.md#priors); on in the shipped spaces"))


class EarlyStopping(_Strict):
    """Stopping unpromising trials early; a stopped trial is recorded as PRUNED, never COMPLETE."""

    method: Literal["none", "asha", "median"] = Field("none", description="asha: asynchronous successive "
                                                      "halving; median: stop below the running median")
    grace_turns: int = Field(1, ge=1, description="no trial is stopped before this many turns")
    reduction_factor: float = Field(3.0, gt=1, description="asha: keep 1 in this many trials at each rung")
    min_samples: int = Field(3, ge=1, description="median: trials needed before comparing to the median")


DYNAMIC_EVALUATION_KINDS = {"max_time_steps": "int", "learning_rate": "float", "decay": "float", "epsilon": "float"}


class Reruns(_Strict):
    """The best configurations trained again with new seeds: families are compared on the means, and a winner is named
    only where the seeds separate it from the runner-up (the 95% interval of the difference excludes 0)."""

    top: int = Field(1, ge=1, description="best configurations of each family to train again")
    seeds: int = Field(3, ge=1, le=1000, description="new seeds for each of them; an interval of the difference "
                                                     "between two families needs 2 or more of each (the shipped "
                                                     "comparisons use 3 or more)")


def _dropout_multipliers(value: Any) -> float | list[float]:
    """A number in [0, 1], or a non-empty list of them, as given (a union would report an error per member)."""
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1 for v in values):
        raise PydanticCustomError("dropout_multipliers", "must be a number in [0, 1] or a non-empty list of them")
    return value


class Evaluation(_Strict):
    """The test protocol on the final checkpoints: batch size 1, each split one continuous stream."""

    bptt: int = Field(70, ge=1, description="window length (the state is carried across windows)")
    temperature: bool = Field(True, description="choose the softmax temperature of each evaluation (deterministic, "
                                                "and MC at each multiplier) on validation first")
    mc_samples: int = Field(0, ge=0, description="Monte-Carlo dropout passes (0: off; the paper used 200)")
    mc_multiplier: Annotated[float | list[float], PlainValidator(
        _dropout_multipliers, json_schema_input_type=float | list[float])] = Field(
        list(MC_MULTIPLIERS), description="dropout rates are multiplied by this under MC; a list: MC is scored at "
                                          "each, and the multiplier with the best validation loss is reported (the "
                                          "reference's test protocol tries 0.6, 0.7, 0.8 and 0.9)")

    @property
    def mc_multipliers(self) -> tuple[float, ...]:
        """The multipliers MC evaluation is scored at."""
        multiplier = self.mc_multiplier
        return tuple(multiplier) if isinstance(multiplier, list) else (multiplier,)


def _dynamic_evaluation_ranges() -> dict[str, SearchRange]:
    """Table 2.6 of the thesis (word level; give max_time_steps up to 50 for characters)."""
    return {"max_time_steps": SearchRange(low=1, high=20),
            "learning_rate": SearchRange(low=1e-6, high=1e-3, log=True),
            "decay": SearchRange(low=1e-6, high=1e-2, log=True),
            "epsilon": SearchRange(low=1e-8, high=1e-2, log=True)}


class DynamicEvaluationStage(_Strict):
    """Stage 2: dynamic evaluation tuned on validation for the best checkpoints of each family."""

    top: int = Field(1, ge=1, description="best checkpoints of each family to tune it for")
    trials: int = Field(20, ge=1, description="trials per checkpoint")
    sampler: Literal["gp", "tpe", "random", "qmc"] = Field("gp", description="Optuna sampler proposing trials")
    startup_trials: int = Field(10, ge=1, description="random trials before the gp/tpe model proposes")
    search_space: dict[str, SearchRange] = Field(default_factory=_dynamic_evaluation_ranges,
                                                 description="max_time_steps, learning_rate, decay, epsilon")
    rms_batch_size: int = Field(1024, ge=1, description="batch of the training windows for the RMS statistics")
    rms_windows: int | None = Field(None, ge=1, description="training windows for the RMS statistics (all if unset)")


class Resources(_Strict):
    cpus_per_trial: float = Field(1.0, gt=0, description="CPU cores per trial (also its torch threads)")
    gpus_per_trial: float = Field(0.0, ge=0, description="GPUs per trial; 0.5 runs two trials on one GPU")
    float32_matmul_precision: Literal["highest", "high"] = Field(
        "highest", description="'high' lets float32 matrix multiplies on GPUs round their operands to TF32 "
                               "(as cuDNN's LSTM does by default): faster, about 1e-3 relative error; CPUs ignore it")


BUDGET_UNITS = ("core_hours", "gpu_hours", "wall_minutes")


class ComputeBudget(_Strict):
    """What the whole study may spend. The tuner divides it among the families (each the same training tokens, or
    the same compute), decides how many configurations each tries and how far each trains, and runs them by
    successive halving with rungs in training tokens (docs/methodology.md, "A budget for the whole study")."""

    core_hours: float | None = Field(None, gt=0, le=1e6, description="CPU core-hours of the trials, counted as "
                                                                      "their processes' CPU time")
    gpu_hours: float | None = Field(None, gt=0, le=1e6, description="GPU-hours of the trials (wall-clock seconds "
                                                                     "times the GPUs each holds)")
    wall_minutes: float | None = Field(None, gt=0, le=1e7, description="minutes of this machine with every trial "
                                                                        "slot busy (converted to core- or GPU-hours "
                                                                        "by the slots the study runs at once)")
    equal: Literal["tokens", "compute"] = Field(
        "tokens", description="what every family gets the same of: training tokens (the papers' choice, the "
                              "families' speeds aside) or compute (core- or GPU-seconds: a faster family trains on "
                              "more tokens)")
    rungs: int = Field(2, ge=1, le=8, description="successive-halving rungs: each keeps the best 1/reduction_factor "
                                                  "of the configurations of the rung below and trains them "
                                                  "reduction_factor times as far; 1: every configuration is trained "
                                                  "to the end")
    reduction_factor: int = Field(3, ge=2, le=10, description="configurations of a rung per one promoted to the next")
    finalists: int = Field(1, ge=1, le=100, description="configurations per family trained to the top rung")

    @model_validator(mode="after")
    def _one_unit(self) -> ComputeBudget:
        given = [name for name in BUDGET_UNITS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(BUDGET_UNITS)}; got "
                             f"{' and '.join(given) if given else 'none'}")
        return self

    @property
    def configurations(self) -> int:
        """Configurations per family at the lowest rung: finalists x reduction_factor^(rungs - 1)."""
        return self.finalists * self.reduction_factor ** (self.rungs - 1)

    def configurations_at(self, rung: int) -> int:
        """Configurations per family trained to rung `rung` (0: the lowest)."""
        return self.finalists * self.reduction_factor ** (self.rungs - 1 - rung)


class StudySpec(_Strict):
    name: str = Field(..., pattern=NAME_PATTERN, description="unique study name")
    description: str = Field("", description="free text shown with the study")
    dataset: DatasetConfig = Field(..., description="the corpus; see its section")
    families: list[Family] = Field(..., min_length=1, description="model families compared at one budget")
    parameter_budget: int = Field(..., ge=1, description="trainable parameters of every model")
    training: Schedule = Field(Schedule(), description="the training schedule; see its section")
    fixed: dict[str, HyperparameterValue] = Field(default_factory=dict, description="hyperparameters held fixed")
    search_space: dict[str, SearchRange] = Field(..., description="hyperparameters searched")
    tuning: Tuning = Field(..., description="sampler, trials and concurrency; see its section")
    early_stopping: EarlyStopping = Field(EarlyStopping(), description="see its section")
    compute_budget: ComputeBudget | None = Field(None, description="what the whole study may spend; the tuner "
                                                                   "decides how many configurations each family tries "
                                                                   "and how far each trains; see its section")
    reruns: Reruns | None = Field(None, description="train the best configurations again with new seeds")
    evaluation: Evaluation | None = Field(None, description="the test protocol on the final checkpoints")
    dynamic_evaluation: DynamicEvaluationStage | None = Field(None, description="stage 2; needs evaluation")
    resources: Resources = Field(Resources(), description="see its section")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_NAMES:
            raise ValueError(f"{name!r} is reserved (the dashboard's page /dashboard/studies/new starts studies); "
                             f"choose another name")
        return name

    @field_validator("families")
    @classmethod
    def _unique_families(cls, families: list[str]) -> list[str]:
        duplicates = sorted(family for family, count in Counter(families).items() if count > 1)
        if duplicates:
            raise ValueError(f"families listed twice: {', '.join(duplicates)}")
        return families

    @model_serializer(mode="wrap")
    def _without_absent_budget(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Leave an unset compute_budget out, so that a study stored before the field existed dumps as it was stored
        (a relaunch continues a study only when its spec is identical)."""
        data = handler(self)
        if self.compute_budget is None:
            data.pop("compute_budget", None)
        return data

    @model_validator(mode="before")
    @classmethod
    def _configurations_from_the_budget(cls, data: Any) -> Any:
        """With a compute_budget, tuning.trials is the rungs' configurations per family: filled in when left out, so
        that every reader of the spec (progress, status, the comparison) counts the trials it will have."""
        if not isinstance(data, dict) or not isinstance(data.get("compute_budget"), dict | ComputeBudget) or \
                not isinstance(data.get("tuning"), dict) or data["tuning"].get("trials") is not None:
            return data
        try:
            budget = ComputeBudget.model_validate(data["compute_budget"])
        except ValueError:
            return data  # reported at its own field
        # the budget's own validation runs again as the field is validated: the count is all that is taken here
        return {**data, "tuning": {**data["tuning"], "trials": budget.configurations}}

    def searched_for(self, family: str) -> dict[str, SearchRange]:
        """The search space of one family's study (unknown names, refused by parse_spec, are not in it)."""
        return {
            name: space for name, space in self.search_space.items()
            if name in HYPERPARAMETERS and HYPERPARAMETERS[name].applies_to(family)
            and (space.families is None or family in space.families)
        }

    def planned_turns(self) -> int | None:
        """Turns each trial runs where the schedule fixes them; None when an epoch or time budget ends it."""
        schedule = self.training
        if schedule.budget_steps is not None:
            return -(-schedule.budget_steps // schedule.steps_per_turn)
        if schedule.budget_epochs is not None or schedule.budget_seconds is not None:
            return None
        return schedule.turns

    @property
    def character_level(self) -> bool:
        """Character-level tasks report bits per character instead of perplexity."""
        return is_character_level(self.dataset.model_dump(mode="json"))

    def fixed_for(self, family: str) -> dict[str, bool | int | float]:
        return {name: value for name, value in self.fixed.items() if HYPERPARAMETERS[name].applies_to(family)}


def spec_to_yaml(spec: StudySpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=False), sort_keys=False)
