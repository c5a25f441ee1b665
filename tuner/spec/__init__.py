"""The study spec: the YAML/JSON document that declares a study, validated once into typed objects.

- `document`: the typed objects (`StudySpec` and its sections);
- `validation`: `parse_spec` / `read_spec`, every problem reported as a `SpecIssue` with its line;
- `hyperparameters`: what a study may fix or search, and the allowed values;
- `space`: the Optuna search space and the model a trial's values build;
- `feasibility`: what can be known not to run before anything is queued;
- `plan` and `estimate`: `tuner plan`'s shapes, parameter split, warnings and time estimate;
- `shipped`: the spaces shipped as package data, found by name; `units`: perplexity or bits per character;
- `yaml_loader`: the bounded YAML/JSON reader; `reference`: the generated docs/spec.md.

Each name below is loaded from its module on first use, so that code needing one light module (the store asks
`space` for Optuna's study name) does not import the model families, and torch, with `document`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {  # name: the module of this package that defines it
    "DYNAMIC_EVALUATION_KINDS": "document", "INT32_MAX": "document", "MAX_SPEC_BYTES": "document",
    "NAME_PATTERN": "document", "DynamicEvaluationStage": "document", "SearchRange": "document",
    "StudySpec": "document", "spec_to_yaml": "document", "is_character_level": "units",
    "SpecError": "issues", "SpecIssue": "issues",
    "load_spec": "validation", "parse_spec": "validation", "read_spec": "validation",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
