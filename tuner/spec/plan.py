"""What a study will train, before anything runs: each family's solved shapes across the searched ranges, where
its parameters go, and the warnings a user should read first (`tuner plan`, `POST /studies/plan`; the same
warnings at `tuner launch` and `POST /studies`).

Shapes come from `trial_setup`, the solver trials use, on a sample of the search space: the corners of the
ranges that change the parameter count, and a fixed-seed uniform sample (what the first, random trials draw). The
smallest and largest hidden sizes are over both; the median shape is the sample's, since corners are extremes.
Time estimates are added by `with_estimates` (tuner/spec/estimate.py) from a probe's measurements.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, Field

from lm_tuner.models import count_parameters
from lm_tuner.models.budget import parameter_breakdown
from lm_tuner.tuner.spec.document import SearchRange, StudySpec
from lm_tuner.tuner.spec.feasibility import budget_issues, reverse_copy_learnable_share, task_issues
from lm_tuner.tuner.spec.hyperparameters import HYPERPARAMETERS
from lm_tuner.tuner.spec.priors import FamilyPrior, family_prior
from lm_tuner.tuner.spec.space import trial_setup

SAMPLES = 50
SAMPLE_SEED = 0
MAX_CORNERS = 64  # 2**6: beyond six shaping ranges, the two extremes and each range flipped alone
MIN_RECURRENT_SHARE = 0.25
MIN_HIDDEN_SIZE = 128  # for vocabularies at least this large (hidden_size_floor)
MIN_LEARNABLE_SHARE = 0.5
SHAPE_PROBE_HIDDEN = 64  # any size > 1 shows whether a value changes the parameter count

Point = dict[str, bool | int | float]


class HiddenSizes(BaseModel):
    min: int
    median: int
    max: int


class TrialEstimate(BaseModel):
    """One trial of the family on this machine, extrapolated from the probe."""

    step_seconds: float = Field(description="one optimisation step at the median shape")
    evaluation_seconds: float = Field(description="one evaluation on the validation tokens of a turn")
    turns: int
    trial_seconds: float
    evaluation_share: float = Field(description="of the trial's time")


class FamilyPlan(BaseModel):
    family: str
    trials: int = Field(description="tuning trials")
    runs: int = Field(description="tuning trials plus reruns")
    sampled_points: int
    infeasible_points: int = Field(description="sampled configurations that do not fit the budget")
    hidden_size: HiddenSizes | None = Field(description="None when no sampled configuration fits the budget")
    median_point: Point | None = Field(description="the sampled model hyperparameters of the median shape")
    embedding_size: int | None = Field(description="at the median shape")
    parameters: dict[str, int] | None = Field(description="embedding, recurrent, softmax and total, at the median")
    prior: FamilyPrior | None = Field(None, description="the published configuration tried first (tuning.priors)")
    estimate: TrialEstimate | None = None


class StudyEstimate(BaseModel):
    study_seconds: float = Field(description="every family's runs, `parallel_trials` at a time")
    parallel_trials: int
    device: str
    threads: int
    probe_seconds: float
    not_included: list[str] = Field(description="stages the estimate leaves out")


class StudyCost(BaseModel):
    """What the whole study needs (tuner/spec/cost.py): device-hours, and how long it takes with its trials in
    parallel on this machine, or on machines of the kind measured where this one cannot run a trial."""

    source: Literal["probe", "flop count"] = Field(description="where the speed comes from: the probe's measurement "
                                                               "here, or a FLOP count over committed benchmarks")
    measured: str = Field(description="what the speed was measured on")
    notes: list[str] = Field(description="how the measurement used differs from this study's machine")
    lower_bound: bool = Field(description="a floor: a FLOP count at the speed of wider models than the study's")
    device: Literal["gpu", "cpu"]
    unit: Literal["GPU-hours", "core-hours"]
    device_hours: float = Field(description="every trial's and stage's time times its GPUs (or cores)")
    stages: dict[str, float] = Field(description="device-hours of tuning, reruns and each later stage")
    flops: float = Field(description="matrix-multiply FLOPs of all of it, counted as the benchmarks count them")
    training_tokens: int = Field(description="tokens trained on by the tuning trials and reruns")
    parallel_trials: int
    wall_seconds: float = Field(description="the study's duration with `parallel_trials` at a time")
    on_this_machine: bool = Field(description="false: this machine cannot run a trial (no GPU, too few cores), and "
                                              "the duration is on machines of the kind measured")
    over_a_day: bool = Field(description="the duration is more than 24 hours")
    summary: str = Field(description="all of it in one line, as `tuner plan` and `tuner launch` print it")
    not_included: list[str]


class Rung(BaseModel):
    configurations: int = Field(description="configurations of the family trained this far")
    steps: int = Field(description="optimisation steps from the start of a configuration to the end of this rung")
    tokens: int = Field(description="training tokens from the start of a configuration to the end of this rung")


class FamilyBudget(BaseModel):
    family: str
    rungs: list[Rung]
    tokens: int = Field(description="training tokens of all the family's configurations (and reruns)")
    device_seconds: float = Field(description="expected device-seconds of it, evaluations included")
    tokens_per_second: float = Field(description="training tokens per device-second, as measured for the plan")

    @property
    def top_steps(self) -> int:
        return self.rungs[-1].steps

    def rung_of_step(self, step: int) -> int | None:
        """The rung that ends at `step`, if one does."""
        return next((index for index, rung in enumerate(self.rungs) if rung.steps == step), None)


class BudgetPlan(BaseModel):
    """A study's compute budget, split among its families and their rungs."""

    unit: Literal["core-hours", "GPU-hours", "wall minutes"]
    amount: float = Field(description="the budget, in `unit`")
    budget_seconds: float = Field(description="the budget in device-seconds (wall minutes: slot-seconds)")
    device_unit: Literal["core-hours", "GPU-hours"] = Field(
        "core-hours", description="what the families' device-seconds count: CPU cores, or GPUs where trials hold them")
    equal: Literal["tokens", "compute"]
    reduction_factor: int
    steps_per_turn: int
    tokens_per_step: int
    parallel_trials: int
    families: list[FamilyBudget]
    expected_seconds: float = Field(description="wall-clock seconds until the last rung ends, with "
                                                "`parallel_trials` at a time")
    reruns: int = Field(0, description="reruns of each family's best configurations, trained as far as its finalists")
    measured: str = Field("", description="where the speeds come from")

    def family(self, name: str) -> FamilyBudget:
        return next(budget for budget in self.families if budget.family == name)


class StudyPlan(BaseModel):
    study: str
    parameter_budget: int
    vocab_size: int
    families: list[FamilyPlan]
    estimate: StudyEstimate | None = None
    cost: StudyCost | None = None
    budget: BudgetPlan | None = Field(None, description="a study with a compute_budget: how it is split among the "
                                                        "families and their rungs")
    warnings: list[str]
    notes: list[str] = Field(default_factory=list, description="what to know that is no problem: how to get data "
                                                               "that is not downloaded yet")


def plan_study(spec: StudySpec, vocab_size: int, *, samples: int = SAMPLES, seed: int = SAMPLE_SEED) -> StudyPlan:
    """Each family's shapes and parameter split over a sample of the search space, and the warnings."""
    families, warnings = [], refusals(spec, vocab_size)
    for family in spec.families:
        planned, family_warnings = _plan_family(spec, family, vocab_size, samples, seed)
        families.append(planned)
        warnings += family_warnings
    return StudyPlan(study=spec.name, parameter_budget=spec.parameter_budget, vocab_size=vocab_size,
                     families=families, warnings=warnings + task_warnings(spec))


def study_warnings(spec: StudySpec, vocab_size: int | None) -> list[str]:
    """What `tuner launch` prints and `POST /studies` returns before a study starts: the plan's warnings without
    a probe; with an unknown vocabulary, only those that do not depend on it."""
    return task_warnings(spec) if vocab_size is None else plan_study(spec, vocab_size).warnings


def refusals(spec: StudySpec, vocab_size: int) -> list[str]:
    """What launch and POST /studies refuse, as the plan shows it."""
    return [f"{issue.render(None)} (launch and POST /studies refuse this study)"
            for issue in budget_issues(spec, vocab_size) + task_issues(spec)]


def task_warnings(spec: StudySpec) -> list[str]:
    """A reverse-copy window that holds the reversal of fewer than half of the examples."""
    share = reverse_copy_learnable_share(spec)
    if share is None or share >= MIN_LEARNABLE_SHARE or task_issues(spec):
        return []
    needed = 4 * spec.dataset.length - 2
    return [f"training.bptt: {spec.training.bptt} holds the whole reversal of only {share:.0%} of the reverse-copy "
            f"examples (windows do not start where examples do); bptt >= 4 * dataset.length - 2 = {needed} holds it "
            f"for at least half"]


def _plan_family(spec: StudySpec, family: str, vocab_size: int, samples: int,
                 seed: int) -> tuple[FamilyPlan, list[str]]:
    shaping = shaping_names(spec, family, vocab_size)
    sampled = random_points(spec, family, samples, seed)
    corners = corner_points(spec, family, shaping)
    solved, failures = {}, []
    for index, point in enumerate(sampled + corners):
        try:
            solved[index] = trial_setup(spec, family, point, vocab_size, seed=0).model
        except ValueError as error:
            failures.append(str(error))
    runs = spec.tuning.trials + (spec.reruns.top * spec.reruns.seeds if spec.reruns else 0)
    empty = FamilyPlan(family=family, trials=spec.tuning.trials, runs=runs, sampled_points=len(sampled + corners),
                       infeasible_points=len(failures), hidden_size=None, median_point=None, embedding_size=None,
                       parameters=None, prior=family_prior(spec, family) if spec.tuning.priors else None)
    warnings = [f"family {family!r}: {len(failures)} of {len(sampled + corners)} sampled configurations do not fit "
                f"parameter_budget ({failures[0]}); trials that draw them fail"] if failures else []
    if not solved:
        return empty, warnings
    hidden = sorted(model.hidden_size for model in solved.values())
    ranked = sorted([index for index in solved if index < len(sampled)] or solved,
                    key=lambda index: solved[index].hidden_size)
    median_index = ranked[(len(ranked) - 1) // 2]
    median = solved[median_index]
    parameters = parameter_breakdown(median)
    planned = empty.model_copy(update={
        "hidden_size": HiddenSizes(min=hidden[0], median=median.hidden_size, max=hidden[-1]),
        "median_point": (sampled + corners)[median_index], "embedding_size": median.embedding_size,
        "parameters": parameters})
    smallest = (sampled + corners)[min(solved, key=lambda index: solved[index].hidden_size)]
    return planned, warnings + _shape_warnings(spec, planned, {name: smallest[name] for name in shaping}, vocab_size)


def hidden_size_floor(vocab_size: int) -> int:
    """The hidden size below which a family is warned about: MIN_HIDDEN_SIZE, or the vocabulary size where that is
    smaller. A softmax over a d-dimensional state gives log-probability matrices of rank at most d + 1 (the softmax
    bottleneck: Yang et al. 2018, Breaking the Softmax Bottleneck); from the vocabulary size on, no next-token
    distribution is out of its reach, so a tiny vocabulary (a generated corpus, characters) needs no more room."""
    return min(MIN_HIDDEN_SIZE, vocab_size)


def _shape_warnings(spec: StudySpec, planned: FamilyPlan, smallest: Point, vocab_size: int) -> list[str]:
    warnings = []
    parameters, hidden = planned.parameters, planned.hidden_size
    recurrent = parameters["recurrent"] / spec.parameter_budget
    if recurrent < MIN_RECURRENT_SHARE:
        warnings.append(
            f"family {planned.family!r}: the recurrent layers hold {recurrent:.0%} of parameter_budget at the median "
            f"shape (hidden size {hidden.median}; embedding {parameters['embedding']:,}, softmax "
            f"{parameters['softmax']:,}, recurrent {parameters['recurrent']:,}): the study compares embeddings more "
            f"than recurrent cells; raise parameter_budget or lower input_embedding_ratio")
    floor = hidden_size_floor(vocab_size)
    if hidden.min < floor:
        where = ", ".join(f"{name}={_shown(value)}" for name, value in smallest.items()) or "the fixed values"
        why = "" if floor == MIN_HIDDEN_SIZE else " (the vocabulary size: a smaller state limits the softmax's rank)"
        warnings.append(
            f"family {planned.family!r}: hidden size as small as {hidden.min} (at {where}; median {hidden.median}); "
            f"below {floor}{why} the recurrent state has little room: raise parameter_budget or narrow the ranges "
            f"that shrink it")
    return warnings


def _shown(value: bool | int | float) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value:.3g}"


def model_ranges(spec: StudySpec, family: str) -> dict[str, SearchRange]:
    """The family's searched hyperparameters that go to the model (the training ones do not change its shape)."""
    return {name: searched for name, searched in spec.searched_for(family).items()
            if HYPERPARAMETERS[name].target == "model"}


def random_points(spec: StudySpec, family: str, samples: int, seed: int) -> list[Point]:
    """`samples` points drawn uniformly (log-uniformly for log ranges) from the model ranges, the same every time."""
    rng = random.Random(f"{seed}/{family}")
    ranges = model_ranges(spec, family)
    return [{name: _draw(rng, searched, HYPERPARAMETERS[name].kind) for name, searched in ranges.items()}
            for _ in range(samples)]


def _draw(rng: random.Random, searched: SearchRange, kind: str) -> bool | int | float:
    if searched.choices is not None:
        return rng.choice(searched.choices)
    low, high = searched.low, searched.high
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if searched.log else rng.uniform(low, high)
    return min(max(round(value), int(low)), int(high)) if kind == "int" else value


def shaping_names(spec: StudySpec, family: str, vocab_size: int) -> list[str]:
    """The family's model ranges whose ends give different parameter counts at one hidden size, moved from either
    extreme (a mogrifier rank matters only with rounds); dropout rates, for one, do not."""
    ranges = model_ranges(spec, family)
    ends = {name: _ends(searched) for name, searched in ranges.items()}
    low = {name: pair[0] for name, pair in ends.items()}
    high = {name: pair[1] for name, pair in ends.items()}
    return [name for name in ranges if _changes_count(spec, family, vocab_size, low, {name: high[name]})
            or _changes_count(spec, family, vocab_size, high, {name: low[name]})]


def corner_points(spec: StudySpec, family: str, shaping: list[str]) -> list[Point]:
    """Every combination of the ends of the `shaping` ranges (at most MAX_CORNERS; past that, both extremes and each
    range flipped alone from either); the family's other model ranges at their low end."""
    ends = {name: _ends(searched) for name, searched in model_ranges(spec, family).items()}
    low = {name: pair[0] for name, pair in ends.items()}
    if 2 ** len(shaping) <= MAX_CORNERS:
        return [low | dict(zip(shaping, chosen, strict=True))
                for chosen in itertools.product(*(ends[name] for name in shaping))]
    extreme = low | {name: ends[name][1] for name in shaping}
    return [low, extreme, *(low | {name: ends[name][1]} for name in shaping),
            *(extreme | {name: ends[name][0]} for name in shaping)]


def _ends(searched: SearchRange) -> tuple[Any, Any]:
    if searched.choices is not None:
        ordered = sorted(set(searched.choices), key=float)
        return ordered[0], ordered[-1]
    return searched.low, searched.high


def _changes_count(spec: StudySpec, family: str, vocab_size: int, base: Point, moved: Point) -> bool:
    """Whether `moved` changes the parameter count of the model at `base` at a fixed hidden size. A point that does
    not fit the budget counts as a change."""
    try:
        counts = {count_parameters(replace(trial_setup(spec, family, point, vocab_size, 0).model,
                                           hidden_size=SHAPE_PROBE_HIDDEN)) for point in (base, base | moved)}
    except ValueError:
        return True
    return len(counts) > 1
