"""What is wrong with a study spec: each problem as a `SpecIssue` naming the field, what was given, what is
allowed and (for text) its line; a `SpecError` carries them all."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from lm_tuner.tuner.spec.document import StudySpec
from lm_tuner.tuner.spec.yaml_loader import shown

CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


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


def field_name(path: tuple[str, ...]) -> str:
    """A key path as a field name, with control characters written as escapes."""
    return ".".join(CONTROL_CHARACTER.sub(lambda c: f"\\u{ord(c.group()):04x}", part) for part in path)


def issue_from_pydantic(error: dict[str, Any], lines: dict[tuple[str, ...], int]) -> SpecIssue:
    path = tuple(str(part) for part in error["loc"])
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        allowed = _allowed_keys(path[:-1])
        message = "unknown field" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    elif error["type"] == "missing":  # a validator of ours may say what the field could be
        allowed = error.get("ctx", {}).get("allowed")
        message = "required field is missing" + (f"; allowed: {allowed}" if allowed else "")
    elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):  # named by the field that selects a kind
        path = (*path, error["ctx"]["discriminator"].strip("'"))
        message = (f"got {shown(error['ctx']['tag'])}; allowed: {error['ctx']['expected_tags']}"
                   if error["type"] == "union_tag_invalid" else "required field is missing")
    elif "input" in error and error["type"] not in ("model_type", "dict_type"):
        message = f"{message} (got {shown(error['input'])})"
    return SpecIssue(field_name(path), message, line_of(path, lines))


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


def line_of(path: tuple[str, ...], lines: dict[tuple[str, ...], int]) -> int | None:
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None
