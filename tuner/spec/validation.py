"""`parse_spec`: a YAML/JSON document validated into a `StudySpec`, every problem reported at once.

The text's syntax and bounds first (yaml_loader), then values no database can store, then the fields (pydantic,
strict), then their meaning (hyperparameters that exist, apply to the families and lie in their ranges). The CLI
and the REST API report the same problems in the same words."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lm_tuner.tuner.spec.document import (
    DYNAMIC_EVALUATION_KINDS,
    INT32_MAX,
    INT32_MIN,
    MAX_SPEC_BYTES,
    SearchRange,
    StudySpec,
)
from lm_tuner.tuner.spec.hyperparameters import HYPERPARAMETERS, families_of
from lm_tuner.tuner.spec.issues import CONTROL_CHARACTER, SpecError, SpecIssue, field_name, issue_from_pydantic, line_of
from lm_tuner.tuner.spec.residual import residual_ratio_issues
from lm_tuner.tuner.spec.spec_file import NotARegularFile, open_regular
from lm_tuner.tuner.spec.yaml_loader import DocumentError, load_document, shown


def load_spec(path: Path | str) -> StudySpec:
    return read_spec(path)[0]


def read_spec(path: Path | str) -> tuple[StudySpec, str]:
    """A spec file validated, with its text (a study keeps the document as it was submitted)."""
    path = Path(path)
    try:
        with open_regular(path) as file:  # never a FIFO, which would wait for a writer forever
            raw = file.read(MAX_SPEC_BYTES + 1)  # at most: a huge file is not read whole
    except NotARegularFile as error:
        raise SpecError([SpecIssue("", f"{error.kind}, not a regular file; a study spec is a YAML or JSON file")],
                        str(path)) from error
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
            raise SpecError([SpecIssue(field_name(path), message, line) for path, message, line in error.problems],
                            source) from error
    else:
        data = document
    if not isinstance(data, dict):
        raise SpecError([SpecIssue("", "the document must be a mapping of fields (name, dataset, families, ...)")],
                        source)
    unstorable = _unstorable_values(data)
    if unstorable:
        raise SpecError([SpecIssue(field_name(path), message, line_of(path, lines)) for path, message in unstorable],
                        source)
    try:  # strict: true is not 1, nor 2.0 an integer
        spec = StudySpec.model_validate(data, strict=True)
    except ValidationError as error:
        raise SpecError([issue_from_pydantic(e, lines) for e in error.errors()], source) from error
    issues = [SpecIssue(field_name(path), message, line_of(path, lines)) for path, message in _semantic_issues(spec)]
    if issues:
        raise SpecError(issues, source)
    return spec


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
    found = CONTROL_CHARACTER.search(text)
    if found is None:
        return None
    return (f"contains the control character U+{ord(found.group()):04X} at position {found.start()}; allowed: text "
            f"without control characters (tab and line breaks excepted)")


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
            issues += _family_issues(("fixed", name), families_of(hyper), spec.families)
    for name, space in spec.search_space.items():
        hyper = HYPERPARAMETERS.get(name)
        if hyper is None:
            issues.append((("search_space", name), f"unknown hyperparameter; allowed: {allowed_names}"))
            continue
        families = tuple(f for f in families_of(hyper) if space.families is None or f in space.families)
        issues += _family_issues(("search_space", name), families, spec.families)
        issues += [(("search_space", name, *path), message) for path, message in _range_issues(hyper, space)]
    issues += residual_ratio_issues(spec)
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
    issues += _budget_issues(spec)
    planned = spec.planned_turns()
    if planned is not None and spec.early_stopping.grace_turns > planned:
        issues.append((("early_stopping", "grace_turns"), f"got {spec.early_stopping.grace_turns}; allowed: at "
                                                          f"most the turns of the schedule ({planned})"))
    for family in spec.families:
        if not spec.searched_for(family):
            issues.append((("search_space",), f"nothing is searched for family {family!r}; add a hyperparameter "
                                              f"that applies to it"))
        needs = [h.name for h in HYPERPARAMETERS.values() if h.required and h.applies_to(family)]
        for name in needs:
            if name not in spec.fixed and name not in spec.search_space:
                issues.append((("fixed",), f"family {family!r} needs {name!r} in fixed or search_space"))
    return issues


def _budget_issues(spec: StudySpec) -> list[tuple[tuple[str, ...], str]]:
    """How a study's trials are bounded: tuning.trials given, or decided by a compute_budget that is the only bound."""
    budget = spec.compute_budget
    if budget is None:
        if spec.tuning.trials is None:
            return [(("tuning", "trials"), "required: the trials per family (or a compute_budget, which decides them)")]
        return []
    issues: list[tuple[tuple[str, ...], str]] = []
    for name in ("turns", "budget_steps", "budget_epochs", "budget_seconds"):
        if name in spec.training.model_fields_set and getattr(spec.training, name) is not None:
            issues.append((("training", name), "a study with a compute_budget decides how far each trial trains (its "
                                               "rungs); remove it, or remove compute_budget to keep a per-trial "
                                               "budget"))
    if spec.tuning.trials != budget.configurations:
        issues.append((("tuning", "trials"), f"got {spec.tuning.trials}; a compute_budget of {budget.rungs} rung(s), "
                                             f"reduction factor {budget.reduction_factor} and {budget.finalists} "
                                             f"finalist(s) tries {budget.configurations} configurations per family: "
                                             f"leave tuning.trials out, or change the rungs"))
    if spec.early_stopping.method != "none":
        issues.append((("early_stopping", "method"), f"got {spec.early_stopping.method!r}; a study with a "
                                                     f"compute_budget stops configurations at its rungs (successive "
                                                     f"halving): leave early_stopping out"))
    if budget.gpu_hours is not None and spec.resources.gpus_per_trial == 0:
        issues.append((("compute_budget", "gpu_hours"), "the trials hold no GPU (resources.gpus_per_trial is 0): "
                                                        "give core_hours, or GPUs to the trials"))
    if budget.core_hours is not None and spec.resources.gpus_per_trial > 0:
        issues.append((("compute_budget", "core_hours"), "the trials run on GPUs (resources.gpus_per_trial > 0): "
                                                         "give gpu_hours"))
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
