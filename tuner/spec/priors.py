"""Each family's first configuration where the papers published one (`tuning.priors`, docs/methodology.md#priors):
the reference's best configuration for the study's task (tuner.spec.published) in this project's hyperparameter
names, its regularisation scaled to the study's training and parameter budget, kept to what the study searches and
clipped into its ranges. It is tried after the spec's own `tuning.initial_points`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from lm_tuner.models import family as family_of
from lm_tuner.models import family_names
from lm_tuner.models.cells import CELLS, LSTMCell
from lm_tuner.trainers import MarkovCorpusConfig, RegisteredDatasetConfig, ReverseCopyConfig
from lm_tuner.tuner.spec.document import SearchRange, StudySpec
from lm_tuner.tuner.spec.feasibility import reverse_copy_example_tokens
from lm_tuner.tuner.spec.hyperparameters import HYPERPARAMETERS
from lm_tuner.tuner.spec.published import (
    CLOSEST_BY_LEVEL,
    LAMB,
    REFERENCE_CONFIGURATIONS,
    TASKS,
    ReferenceConfiguration,
    Task,
)
from lm_tuner.tuner.spec.throughput import measured_throughput

Value = bool | int | float

SAME_NAME = ("learning_rate", "l2_penalty", "num_layers", "input_embedding_ratio", "cap_input_gate",
             "residual_connections", "embedding_dropout", "input_dropout", "inter_layer_dropout", "state_dropout",
             "output_dropout")
"""Reference settings that are this project's hyperparameters of the same name and meaning."""

NO_COUNTERPART: dict[str, str] = {
    "num_params": "the study's parameter_budget, which the scaling compares it with",
    "batch_size": "training.batch_size; with the window and the turns, the reference's training length, which the "
                  "scaling compares the study's with",
    "max_time_steps": "training.bptt (see batch_size)",
    "steps_per_turn": "training.steps_per_turn (see batch_size)",
    "turns": "the training budget (see batch_size)",
    "accum_batch_size": "gradient accumulation: how a batch was computed, not what it was",
    "optimizer_type": "RMSProp, which the project's Adam with beta1 = 0 is, with bias correction "
                      "(docs/methodology.md#optimiser); not a hyperparameter",
    "rmsprop_beta2": "Adam's beta2, 0.999 as here; not a hyperparameter",
    "max_grad_norm": "training.max_grad_norm, 10 as here; not a hyperparameter",
    "trigger_averaging_turns": "training.averaging (tail averaging's patience); not a hyperparameter",
    "trigger_averaging_at_the_latest": "training.averaging (tail averaging's latest_start); not a hyperparameter",
    "eval_softmax_temperature": "training.search_temperature (negative: searched at each evaluation, as here)",
    "lstm_skip_connection": "the skip wiring, which every family uses without residual_connections (the model's "
                            "output is the sum of its layers')",
    "downprojected_output_dropout": "-1 means output_dropout again after the projection, as output_dropout does here",
    "forget_bias": "the initialisation's forget-gate bias mean, 1 as here (chrono_t_max 0)",
    "trainable_initial_state": "false: the state starts at zero, as here",
    "drop_state_probability": "0.01 of windows start from a zero state in the reference; no counterpart here",
    "token_dropout": "0 in every configuration; no counterpart here",
    "update_dropout": "0 in every configuration; no counterpart here",
}
"""Reference settings that are not hyperparameters of this project, and where each went."""

REGULARISERS = ("input_dropout", "inter_layer_dropout", "state_dropout", "output_dropout", "embedding_dropout",
                "l2_penalty")
"""The values scaled by `regularisation_scale`; every other value is kept, except the mogrifier rank."""


class FamilyPrior(BaseModel):
    """What a family's study starts from: the reference configuration, how it was scaled, and the values tried."""

    family: str
    reference: str | None = Field(None, description="the configuration's task, budget and model")
    source: str | None = Field(None, description="its file in deepmind/lamb, at the commit read")
    stands_in: str | None = Field(None, description="why another task's configuration stands in for the study's")
    scale: float | None = Field(None, description="the factor the dropout rates and the L2 penalty were multiplied by")
    scale_reason: str | None = Field(None, description="the training and budgets the factor compares")
    values: dict[str, Value] = Field(default_factory=dict, description="the configuration tried: the searched "
                                                                       "hyperparameters, scaled and clipped")
    notes: list[str] = Field(default_factory=list, description="values clipped into the study's ranges, or left out")
    none_because: str | None = Field(None, description="why the family has no prior")


@dataclass(frozen=True)
class StudyTraining:
    passes: float  # over the training split
    said: str


def prior_points(spec: StudySpec, family: str) -> list[dict[str, Value]]:
    """The family's prior as initial points: none where `tuning.priors` is off or the family has none."""
    if not spec.tuning.priors:
        return []
    prior = family_prior(spec, family)
    return [prior.values] if prior.values else []


def study_priors(spec: StudySpec) -> list[FamilyPrior]:
    """Every family's prior where `tuning.priors` is on; none where it is off."""
    return [family_prior(spec, family) for family in spec.families] if spec.tuning.priors else []


def family_prior(spec: StudySpec, family: str) -> FamilyPrior:
    """The published configuration nearest the study (its task, else the closest by level; of several, the nearest
    parameter budget), scaled and clipped; or why there is none."""
    task, stands_in = study_task(spec)
    reference = reference_for(task, family, spec.parameter_budget)
    if reference is None:
        return FamilyPrior(family=family, stands_in=stands_in,
                           none_because=f"{LAMB} publishes no {family} configuration for {task.title}")
    try:
        training = study_training(spec, family, task)
    except ValueError as error:  # a compute budget too small for its rungs: the plan and the launch say so too
        return FamilyPrior(family=family, reference=reference.title, source=reference.source, stands_in=stands_in,
                           none_because=f"how far its trials train is not known: {error}")
    reference_passes = reference.training_tokens / task.train_tokens
    scale = regularisation_scale(training.passes, spec.parameter_budget, reference_passes, reference.parameters)
    scaled = scaled_values(mapped_values(reference), scale, spec.parameter_budget / reference.parameters)
    values, notes = clipped_into(scaled, spec.searched_for(family))
    reason = (f"{training.said}, {spec.parameter_budget:,} parameters; the reference: {reference_passes:.0f} passes, "
              f"{reference.parameters:,} parameters")
    return FamilyPrior(family=family, reference=reference.title, source=reference.source, stands_in=stands_in,
                       scale=scale, scale_reason=reason, values=values, notes=notes,
                       none_because=None if values else "the study searches none of its hyperparameters")


def mapped_values(reference: ReferenceConfiguration) -> dict[str, Value]:
    """The reference configuration in this project's hyperparameters (NO_COUNTERPART lists the rest)."""
    settings = reference.settings
    values: dict[str, Value] = {name: settings[name] for name in SAME_NAME}
    values["tie_embeddings"] = settings["share_input_and_output_embeddings"]
    values["softmax_components"] = max(1, settings["mos_num_components"])  # 0 is one softmax there
    if settings["feature_mask_rounds"] > 0:  # 0 rounds is the plain LSTM there
        values["mogrifier_rounds"] = settings["feature_mask_rounds"]
        values["mogrifier_rank"] = settings["feature_mask_rank"]  # 0 is full rank there, <= 0 here
    return values


def regularisation_scale(study_passes: float, study_parameters: int, reference_passes: float,
                         reference_parameters: int) -> float:
    """The factor a reference's dropout rates and L2 penalty are multiplied by for a study that trains for
    `study_passes` over its data at `study_parameters` (docs/methodology.md#priors):

        min(1, ln(1 + passes x parameters / reference parameters) / ln(1 + reference passes))

    Regularisation closes the gap between training and held-out loss, which opens only as a model sees its data
    again: one pass has none. A model with a fraction of the reference's parameters memorises at that fraction of
    its pace, so its passes count for that fraction; later passes widen the gap less than earlier ones, hence the
    logarithm. The reference's own setting gives 1; never more."""
    exposure = study_passes * study_parameters / reference_parameters
    return min(1.0, math.log1p(exposure) / math.log1p(reference_passes))


def scaled_rank(rank: int, parameter_ratio: float) -> int:
    """A low mogrifier rank kept in proportion to the hidden size, which grows as the square root of the budget
    where the recurrent layers hold most of it; at least 1 (0 would be full rank). Full rank stays full."""
    return rank if rank <= 0 else max(1, round(rank * math.sqrt(parameter_ratio)))


def scaled_values(values: dict[str, Value], scale: float, parameter_ratio: float) -> dict[str, Value]:
    """The regularisers multiplied by `scale`, the mogrifier rank by the budget; the rest (the learning rate, the
    shape, the rounds) kept."""
    scaled = dict(values)
    for name in REGULARISERS:
        if name in scaled:
            scaled[name] = scaled[name] * scale
    if "mogrifier_rank" in scaled:
        scaled["mogrifier_rank"] = scaled_rank(int(scaled["mogrifier_rank"]), parameter_ratio)
    return scaled


def clipped_into(values: dict[str, Value], ranges: dict[str, SearchRange]) -> tuple[dict[str, Value], list[str]]:
    """The values of the searched hyperparameters, each clipped into its range or moved to the nearest of its
    choices (a true/false value that is not a choice is left out); what changed, in words."""
    kept: dict[str, Value] = {}
    notes: list[str] = []
    for name, searched in ranges.items():
        if name not in values:
            continue
        value, kind = values[name], HYPERPARAMETERS[name].kind
        if searched.choices is not None:
            choice = _nearest_choice(value, searched.choices, kind)
            if choice is None:
                notes.append(f"{name} {_shown(value)} left out: not among the study's choices")
                continue
            if choice != value:
                notes.append(f"{name} {_shown(value)} moved to {_shown(choice)}, the nearest of the study's choices")
            kept[name] = choice
            continue
        low, high = searched.low, searched.high
        clipped = min(max(value, low), high)
        if kind == "int":
            clipped = int(round(clipped))
        if clipped != value:
            notes.append(f"{name} {_shown(value)} clipped to {_shown(clipped)}, into the study's range "
                         f"{_shown(low)}-{_shown(high)}")
        kept[name] = clipped
    return kept, notes


def _nearest_choice(value: Value, choices: list[Value], kind: str) -> Value | None:
    if kind == "bool":
        return value if any(choice is value for choice in choices) else None
    return min(choices, key=lambda choice: abs(float(choice) - float(value)))


def study_task(spec: StudySpec) -> tuple[Task, str | None]:
    """The published task of the study's dataset, else the closest by level and why it stands in."""
    dataset = spec.dataset
    if isinstance(dataset, RegisteredDatasetConfig) and dataset.name in TASKS:
        return TASKS[dataset.name], None
    task = TASKS[CLOSEST_BY_LEVEL["char" if spec.character_level else "word"]]
    return task, (f"{_dataset_said(dataset)} is none of the tasks the papers published configurations for: "
                  f"{task.title}, the closest by level, stands in")


def reference_for(task: Task, family: str, parameter_budget: int) -> ReferenceConfiguration | None:
    """The task's configuration for the family nearest `parameter_budget` (by ratio); None where none is published."""
    published = [reference for reference in REFERENCE_CONFIGURATIONS
                 if reference.task == task.name and reference_family(reference) == family]
    return min(published, key=lambda reference: abs(math.log(reference.parameters / parameter_budget)), default=None)


def reference_family(reference: ReferenceConfiguration) -> str | None:
    """The registered family a reference configuration's model is: the capped LSTM cell, with a mogrifier where it
    has rounds, in the project's own language model with skip wiring (the first such family registered)."""
    cell = next(name for name, cell_class in CELLS.items() if cell_class is LSTMCell)
    return next((name for name in family_names() if (registered := family_of(name)).cell == cell
                 and registered.mogrifier == reference.mogrifier and registered.model is None
                 and not registered.residual), None)


def study_training(spec: StudySpec, family: str, task: Task) -> StudyTraining:
    """How far each trial trains, in passes over the training split, and how that was worked out."""
    schedule = spec.training
    if schedule.budget_epochs is not None:
        return StudyTraining(schedule.budget_epochs, f"{schedule.budget_epochs:g} passes (training.budget_epochs)")
    corpus, corpus_said = _training_split(spec, task)
    if spec.compute_budget is not None:
        tokens, how = _tokens_at_the_top_rung(spec, family)
    elif schedule.budget_seconds is not None:
        tokens, how = _tokens_in_seconds(spec, family)
    else:
        steps = schedule.budget_steps or schedule.turns * schedule.steps_per_turn
        tokens = steps * schedule.batch_size * schedule.bptt
        how = f"{steps:,} steps of {schedule.batch_size} x {schedule.bptt} tokens"
    return StudyTraining(tokens / corpus, f"{how}: {tokens / corpus:.3g} passes over {corpus:,} tokens{corpus_said}")


TRAINING_FLOPS_PER_PARAMETER = 6
"""Matrix-multiply FLOPs per parameter and training token, as the benchmarks count them: 2 per weight forward, 3
passes (tuner/spec/throughput.py's rates are in those FLOPs)."""


def _tokens_in_seconds(spec: StudySpec, family: str) -> tuple[float, str]:
    """Tokens a trial trains on in `budget_seconds` at the counted speed (`_counted_step_seconds`)."""
    schedule = spec.training
    step, devices, machine = _counted_step_seconds(spec, family)
    wall = schedule.budget_seconds / (devices if spec.resources.gpus_per_trial == 0 and schedule.clock == "process"
                                      else 1)
    tokens = wall / step * schedule.batch_size * schedule.bptt
    return tokens, f"about {tokens:,.0f} tokens in {schedule.budget_seconds:g} s at the speed measured on {machine}"


def _tokens_at_the_top_rung(spec: StudySpec, family: str) -> tuple[float, str]:
    """Tokens a finalist trains on: the top rung of the study's compute budget split among its families
    (tuner.spec.budget_plan) at the counted speeds. The plan stored when the study first runs comes from measured
    speeds, so its rungs can differ."""
    from lm_tuner.tuner.spec.budget_plan import FamilySpeed, plan_budget  # it imports the plan, which imports this

    speeds, machine = [], ""
    for name in spec.families:
        step, devices, machine = _counted_step_seconds(spec, name)
        speeds.append(FamilySpeed(name, step_wall=step, step_device=step * devices, evaluation_wall=0.0,
                                  evaluation_device=0.0))
    top = plan_budget(spec, speeds, spec.tuning.concurrency).family(family).rungs[-1]
    return top.tokens, (f"the top rung's {top.steps:,} steps of {spec.training.batch_size} x {spec.training.bptt} "
                        f"tokens (compute_budget, at the speed measured on {machine})")


def _counted_step_seconds(spec: StudySpec, family: str) -> tuple[float, float, str]:
    """Wall seconds of one training step, the devices a trial holds (cores or GPUs) and the machine, at the speed the
    benchmarks measured for the family on the slowest CPU kind (or the default GPU), at TRAINING_FLOPS_PER_PARAMETER:
    the same wherever it is worked out, so the plan, the launch and the status agree. Evaluations are not counted."""
    resources = spec.resources
    device = "gpu" if resources.gpus_per_trial > 0 else "cpu"
    threads = max(1, int(resources.cpus_per_trial))
    throughput = measured_throughput([family], device=device, threads=threads, cpu_kind=None, gpu_name=None,
                                     character_level=spec.character_level)
    flops = spec.training.batch_size * spec.training.bptt * TRAINING_FLOPS_PER_PARAMETER * spec.parameter_budget
    devices = resources.gpus_per_trial if device == "gpu" else threads
    return flops / throughput.flops_per_second[family], devices, throughput.machine


def _training_split(spec: StudySpec, task: Task) -> tuple[int, str]:
    """Tokens of the study's training split where the spec tells them, else the task's (said)."""
    dataset = spec.dataset
    if isinstance(dataset, MarkovCorpusConfig):
        return dataset.train_tokens, ""
    if isinstance(dataset, ReverseCopyConfig):
        return dataset.train_examples * reverse_copy_example_tokens(dataset), ""
    if isinstance(dataset, RegisteredDatasetConfig) and dataset.name == task.name:
        return task.train_tokens, ""
    return task.train_tokens, f" (taken as large as {task.title}: this corpus's size is known once it is read)"


def _dataset_said(dataset: Any) -> str:
    if isinstance(dataset, RegisteredDatasetConfig):
        return f"dataset {dataset.name}"
    if isinstance(dataset, MarkovCorpusConfig | ReverseCopyConfig):
        return f"the generated {'Markov' if isinstance(dataset, MarkovCorpusConfig) else 'reverse-copy'} corpus"
    return f"the corpus in {dataset.path}"


def prior_line(prior: FamilyPrior) -> str:
    """One line per family, as `tuner plan`, `tuner status` and the study page show it."""
    if prior.none_because is not None:
        return f"{prior.family}: no prior ({prior.none_because})"
    values = " ".join(f"{name}={_shown(value)}" for name, value in prior.values.items())
    said = [f"{prior.family}: {prior.reference} ({prior.source}), regularisation x{prior.scale:.3g}: {values}"]
    if prior.stands_in:
        said.append(prior.stands_in)
    return "; ".join(said + prior.notes)


def _shown(value: Value) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value:.3g}"


def stored_study_priors(spec_data: dict[str, Any]) -> list[FamilyPrior]:
    """`study_priors` of a study's spec as stored; a study stored before `tuning.priors` existed has none."""
    if not spec_data.get("tuning", {}).get("priors"):
        return []
    return study_priors(StudySpec.model_validate(spec_data))
