"""The study specification: the one document (YAML or JSON) that describes a study.

`parse_spec` validates a document into a `StudySpec`; every problem becomes a `SpecIssue` that
names the field, what was given and what is allowed, and — when the document came as text — its
line, so the CLI and the REST API report the same errors in the same words.
"""

from __future__ import annotations

import math
import re
import typing
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from lm_tuner.trainers import DatasetConfig, Schedule
from lm_tuner.tuner.hyperparameters import HYPERPARAMETERS
from lm_tuner.tuner.yaml_loader import DocumentError, load_document, shown

Family = Literal["lstm", "mogrifier", "rlstm", "mogrifier_rlstm", "mlstm"]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
CHARACTER_LEVEL_CORPORA = ("ptb-char", "enwik8", "text8")  # scored in bits per character
MAX_SPEC_BYTES = 256 * 1024  # a spec file, or a request body that carries one
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
"""Every integer of a spec fits the database's 32-bit Integer columns (seeds, counts, budgets, sizes)."""
MAX_TUNING_SEED = 2**30
"""Trial seeds add the trial number to the tuning seed, and rerun seeds 1,000,000 per repeat (tuner.space): at most
1,000,000 trials and 1,000 reruns keep every derived seed below 2**31."""
_CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _hyperparameter_value(value: Any) -> bool | int | float:
    """The value as given: a union would try each member in turn, and report three errors for one value."""
    if isinstance(value, bool | int | float):
        return value
    raise PydanticCustomError("hyperparameter_value", "must be a number or true/false")


HyperparameterValue = Annotated[bool | int | float,
                                PlainValidator(_hyperparameter_value, json_schema_input_type=bool | int | float)]


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
    trials: int = Field(..., ge=1, le=1_000_000, description="trials per model family")
    startup_trials: int = Field(10, ge=1, description="random trials before the gp/tpe model proposes")
    concurrency: int = Field(1, ge=1, description="trials running at once")
    seed: int = Field(0, ge=0, le=MAX_TUNING_SEED, description="seeds the sampler; trial k trains with seed + k")
    max_retries: int = Field(2, ge=0, description="restarts of a trial whose worker process or node died")
    initial_points: list[dict[str, HyperparameterValue]] = Field(
        default_factory=list, description="configurations tried first, in order (each family takes the "
                                          "hyperparameters it searches; the rest are sampled)")


class EarlyStopping(_Strict):
    """Stopping unpromising trials early; a stopped trial is recorded as PRUNED, never COMPLETE."""

    method: Literal["none", "asha", "median"] = Field("none", description="asha: asynchronous successive "
                                                      "halving; median: stop below the running median")
    grace_turns: int = Field(1, ge=1, description="no trial is stopped before this many turns")
    reduction_factor: float = Field(3.0, gt=1, description="asha: keep 1 in this many trials at each rung")
    min_samples: int = Field(3, ge=1, description="median: trials needed before comparing to the median")


DYNAMIC_EVALUATION_KINDS = {"max_time_steps": "int", "learning_rate": "float", "decay": "float", "epsilon": "float"}


class Reruns(_Strict):
    """The best configurations trained again with new seeds: families are compared on the means."""

    top: int = Field(1, ge=1, description="best configurations of each family to train again")
    seeds: int = Field(3, ge=1, le=1000, description="new seeds for each of them")


class Evaluation(_Strict):
    """The test protocol on the final checkpoints: batch size 1, each split one continuous stream."""

    bptt: int = Field(70, ge=1, description="window length (the state is carried across windows)")
    temperature: bool = Field(True, description="choose the softmax temperature on validation first")
    mc_samples: int = Field(0, ge=0, description="Monte-Carlo dropout passes (0: off; the paper used 200)")
    mc_multiplier: float = Field(0.8, ge=0, le=1, description="dropout rates are multiplied by this under MC")


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
    reruns: Reruns | None = Field(None, description="train the best configurations again with new seeds")
    evaluation: Evaluation | None = Field(None, description="the test protocol on the final checkpoints")
    dynamic_evaluation: DynamicEvaluationStage | None = Field(None, description="stage 2; needs evaluation")
    resources: Resources = Field(Resources(), description="see its section")

    @field_validator("families")
    @classmethod
    def _unique_families(cls, families: list[str]) -> list[str]:
        duplicates = sorted(family for family, count in Counter(families).items() if count > 1)
        if duplicates:
            raise ValueError(f"families listed twice: {', '.join(duplicates)}")
        return families

    def searched_for(self, family: str) -> dict[str, SearchRange]:
        """The search space of one family's study (unknown names, refused by parse_spec, are not in it)."""
        return {
            name: space for name, space in self.search_space.items()
            if name in HYPERPARAMETERS and family in HYPERPARAMETERS[name].families
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
        return {name: value for name, value in self.fixed.items() if family in HYPERPARAMETERS[name].families}


def is_character_level(dataset: dict[str, Any]) -> bool:
    """Whether a dataset section (as stored with a study) names a character-level corpus."""
    return (dataset.get("name") or dataset.get("format")) in CHARACTER_LEVEL_CORPORA


@dataclass(frozen=True)
class SpecIssue:
    field: str
    message: str
    line: int | None = None

    def render(self, source: str | None) -> str:
        where = f"{source}:{self.line}: " if source and self.line else (f"{source}: " if source else "")
        return f"{where}{self.field}: {self.message}" if self.field else f"{where}{self.message}"


class SpecError(ValueError):
    """A study specification that cannot be accepted; `issues` lists every problem found."""

    def __init__(self, issues: list[SpecIssue], source: str | None = None) -> None:
        self.issues = issues
        self.source = source
        super().__init__("invalid study spec:\n" + "\n".join("  " + i.render(source) for i in issues))


def load_spec(path: Path | str) -> StudySpec:
    return read_spec(path)[0]


def read_spec(path: Path | str) -> tuple[StudySpec, str]:
    """A spec file validated, with its text (a study keeps the document as it was submitted)."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SPEC_BYTES + 1)  # at most: `--space /dev/zero` must not read forever
    except OSError as error:
        raise SpecError([SpecIssue("", f"cannot read the spec file: {error.strerror}")], str(path)) from error
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError([SpecIssue("", f"the file is larger than {MAX_SPEC_BYTES:,} bytes; a study spec is a short "
                                       f"YAML or JSON document")], str(path))
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        raise SpecError([SpecIssue("", "not a text file (a NUL byte, or not UTF-8); a study spec is a YAML or JSON "
                                       "document")], str(path))
    return parse_spec(text, source=str(path)), text


def parse_spec(document: str | dict[str, Any], source: str | None = None) -> StudySpec:
    """Validate a YAML/JSON text (or an already parsed mapping) into a StudySpec.

    Every problem is a SpecIssue in the raised SpecError: the text's syntax and bounds first (tuner.yaml_loader),
    then values no database can store, then the fields, then their meaning.
    """
    lines: dict[tuple[str, ...], int] = {}
    if isinstance(document, str):
        try:
            data, lines = load_document(document)
        except DocumentError as error:
            raise SpecError([SpecIssue(_field(path), message, line) for path, message, line in error.problems],
                            source) from error
    else:
        data = document
    if not isinstance(data, dict):
        raise SpecError([SpecIssue("", "the document must be a mapping of fields (name, dataset, families, ...)")],
                        source)
    unstorable = _unstorable_values(data)
    if unstorable:
        raise SpecError([SpecIssue(_field(path), message, _line_of(path, lines)) for path, message in unstorable],
                        source)
    try:  # strict: true is not 1, nor 2.0 an integer
        spec = StudySpec.model_validate(data, strict=True)
    except ValidationError as error:
        raise SpecError([_issue_from_pydantic(e, lines) for e in error.errors()], source) from error
    issues = [SpecIssue(_field(path), message, _line_of(path, lines)) for path, message in _semantic_issues(spec)]
    if issues:
        raise SpecError(issues, source)
    return spec


def spec_to_yaml(spec: StudySpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=False), sort_keys=False)


def _unstorable_values(data: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Values that no study can hold, wherever they are: integers beyond the database's 32-bit columns, infinite
    or NaN numbers (the spec is stored as JSON, which has neither) and text with control characters (PostgreSQL
    refuses NUL in text)."""
    if isinstance(data, dict):
        issues = []
        for key, value in data.items():
            child = (*path, str(key))
            if isinstance(key, str) and (problem := _text_problem(key)):
                issues.append((child, f"the key {problem}"))
            issues += _unstorable_values(value, child)
        return issues
    if isinstance(data, list):
        return [issue for index, item in enumerate(data) for issue in _unstorable_values(item, (*path, str(index)))]
    if isinstance(data, int) and not isinstance(data, bool) and not INT32_MIN <= data <= INT32_MAX:
        return [(path, f"got {shown(data)}; allowed: an integer in [{INT32_MIN}, {INT32_MAX}] (the database stores "
                       f"32-bit integers)")]
    if isinstance(data, float) and not math.isfinite(data):
        return [(path, f"got {data}; allowed: a finite number")]
    if isinstance(data, str) and (problem := _text_problem(data)):
        return [(path, problem)]
    return []


def _text_problem(text: str) -> str | None:
    found = _CONTROL_CHARACTER.search(text)
    if found is None:
        return None
    return (f"contains the control character U+{ord(found.group()):04X} at position {found.start()}; allowed: text "
            f"without control characters (tab and line breaks excepted)")


def _field(path: tuple[str, ...]) -> str:
    """A key path as a field name, with control characters written as escapes."""
    return ".".join(_CONTROL_CHARACTER.sub(lambda c: f"\\u{ord(c.group()):04x}", part) for part in path)


def _semantic_issues(spec: StudySpec) -> list[tuple[tuple[str, ...], str]]:
    allowed_names = ", ".join(HYPERPARAMETERS)
    issues: list[tuple[tuple[str, ...], str]] = []
    for name, value in spec.fixed.items():
        hyper = HYPERPARAMETERS.get(name)
        if hyper is None:
            issues.append((("fixed", name), f"unknown hyperparameter; allowed: {allowed_names}"))
        elif not hyper.accepts(value):
            issues.append((("fixed", name), f"got {value!r}; allowed: {hyper.allowed()}"))
        elif name in spec.search_space:
            issues.append((("fixed", name), "is also in search_space; a hyperparameter is either fixed or searched"))
        else:
            issues += _family_issues(("fixed", name), hyper.families, spec.families)
    for name, space in spec.search_space.items():
        hyper = HYPERPARAMETERS.get(name)
        if hyper is None:
            issues.append((("search_space", name), f"unknown hyperparameter; allowed: {allowed_names}"))
            continue
        families = tuple(f for f in hyper.families if space.families is None or f in space.families)
        issues += _family_issues(("search_space", name), families, spec.families)
        issues += [(("search_space", name, *path), message) for path, message in _range_issues(hyper, space)]
    choice_sets = {name: set(space.choices) for name, space in spec.search_space.items() if space.choices is not None}
    for index, point in enumerate(spec.tuning.initial_points):
        for name, value in point.items():
            path = ("tuning", "initial_points", str(index), name)
            if name not in spec.search_space:
                issues.append((path, f"not a searched hyperparameter; allowed: {', '.join(spec.search_space)}"))
            elif not _in_range(value, spec.search_space[name], choice_sets.get(name)):
                issues.append((path, f"got {value!r}; outside the search range of {name}"))
    if spec.dynamic_evaluation is not None:
        if spec.evaluation is None:
            issues.append((("dynamic_evaluation",), "needs an evaluation section: its results are test-protocol "
                                                    "evaluations"))
        for name, space in spec.dynamic_evaluation.search_space.items():
            path = ("dynamic_evaluation", "search_space", name)
            kind = DYNAMIC_EVALUATION_KINDS.get(name)
            if kind is None:
                issues.append((path, f"unknown; allowed: {', '.join(DYNAMIC_EVALUATION_KINDS)}"))
            elif space.choices is None and (space.low is None or space.high is None):
                issues.append((path, "needs low and high (or choices)"))
            elif space.choices is None and (space.low >= space.high or (space.log and space.low <= 0)
                                            or (kind == "int" and not (float(space.low).is_integer()
                                                                       and float(space.high).is_integer()))):
                issues.append((path, f"got [{space.low}, {space.high}]; allowed: low < high"
                                     + (", integers" if kind == "int" else "") + (", low > 0 with log" if space.log
                                                                                 else "")))
    planned = spec.planned_turns()
    if planned is not None and spec.early_stopping.grace_turns > planned:
        issues.append((("early_stopping", "grace_turns"), f"got {spec.early_stopping.grace_turns}; allowed: at "
                                                          f"most the turns of the schedule ({planned})"))
    for family in spec.families:
        if not spec.searched_for(family):
            issues.append((("search_space",), f"nothing is searched for family {family!r}; add a hyperparameter "
                                              f"that applies to it"))
        needs = [h.name for h in HYPERPARAMETERS.values() if h.required and family in h.families]
        for name in needs:
            if name not in spec.fixed and name not in spec.search_space:
                issues.append((("fixed",), f"family {family!r} needs {name!r} in fixed or search_space"))
    return issues


def _family_issues(path: tuple[str, ...], applies_to: tuple[str, ...], families: list[str]) -> list:
    if any(f in applies_to for f in families):
        return []
    return [(path, f"applies to families {', '.join(applies_to) or '(none)'}, "
                   f"none of which is in families ({', '.join(families)})")]


def _range_issues(hyper, space: SearchRange) -> list[tuple[tuple[str, ...], str]]:
    if space.choices is not None:
        if space.low is not None or space.high is not None:
            return [((), "give either choices or low/high, not both")]
        if not space.choices:
            return [(("choices",), "needs at least one value")]
        return [(("choices", str(index)), f"got {shown(choice)}; allowed: {hyper.allowed()}")
                for index, choice in enumerate(space.choices) if not hyper.accepts(choice)]
    if hyper.kind == "bool":
        return [((), "a true/false hyperparameter is searched with choices: [true, false]")]
    if space.low is None or space.high is None:
        return [((), "needs low and high (or choices)")]
    issues = []
    for bound in ("low", "high"):
        value = getattr(space, bound)
        if hyper.kind == "int" and not float(value).is_integer():
            issues.append(((bound,), f"got {value!r}; allowed: an integer"))
        elif not hyper.accepts(int(value) if hyper.kind == "int" else value):
            issues.append(((bound,), f"got {value!r}; allowed: {hyper.allowed()}"))
    if space.low >= space.high:
        issues.append((("high",), f"got {space.high!r}; must be greater than low ({space.low!r})"))
    if space.log and space.low <= 0:
        issues.append((("low",), f"got {space.low!r}; a log-scaled range needs low > 0"))
    if not (math.isfinite(space.low) and math.isfinite(space.high)):
        issues.append(((), "low and high must be finite"))
    return issues


def _in_range(value: bool | int | float, space: SearchRange, choices: set[bool | int | float] | None) -> bool:
    if choices is not None:
        return value in choices
    if isinstance(value, bool) or space.low is None or space.high is None:
        return False
    return space.low <= value <= space.high


def _issue_from_pydantic(error: dict[str, Any], lines: dict[tuple[str, ...], int]) -> SpecIssue:
    path = tuple(str(part) for part in error["loc"])
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(path[:-1])
        message = "unknown field" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    elif error["type"] == "missing":
        message = "required field is missing"
    elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):  # named by the field that selects a kind
        path = (*path, error["ctx"]["discriminator"].strip("'"))
        message = (f"got {shown(error['ctx']['tag'])}; allowed: {error['ctx']['expected_tags']}"
                   if error["type"] == "union_tag_invalid" else "required field is missing")
    elif "input" in error and error["type"] not in ("model_type", "dict_type"):
        message = f"{message} (got {shown(error['input'])})"
    return SpecIssue(_field(path), message, _line_of(path, lines))


def _allowed_keys(path: tuple[str, ...]) -> list[str]:
    """Field names of the model found at `path` inside StudySpec; mapping keys are stepped over."""
    model: Any = StudySpec
    parts = iter(path)
    for part in parts:
        field = model.model_fields.get(part)
        if field is None:
            return []
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
            if next(parts, None) is None:
                return []
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _line_of(path: tuple[str, ...], lines: dict[tuple[str, ...], int]) -> int | None:
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None
