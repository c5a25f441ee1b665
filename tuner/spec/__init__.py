"""The study spec: the YAML/JSON document that declares a study, validated once into typed objects.

- `document`: the typed objects (`StudySpec` and its sections);
- `validation`: `parse_spec` / `read_spec`, every problem reported as a `SpecIssue` with its line;
- `hyperparameters`: what a study may fix or search, and the allowed values;
- `space`: the Optuna search space and the model a trial's values build;
- `feasibility`: what can be known not to run before anything is queued;
- `plan` and `estimate`: `tuner plan`'s shapes, parameter split, warnings and time estimate;
- `shipped`: the spaces shipped as package data, found by name; `units`: perplexity or bits per character;
- `yaml_loader`: the bounded YAML/JSON reader; `reference`: the generated docs/spec.md.
"""

from lm_tuner.tuner.spec.document import (
    DYNAMIC_EVALUATION_KINDS,
    INT32_MAX,
    MAX_SPEC_BYTES,
    NAME_PATTERN,
    DynamicEvaluationStage,
    SearchRange,
    StudySpec,
    is_character_level,
    spec_to_yaml,
)
from lm_tuner.tuner.spec.issues import SpecError, SpecIssue
from lm_tuner.tuner.spec.validation import load_spec, parse_spec, read_spec

__all__ = [
    "DYNAMIC_EVALUATION_KINDS",
    "INT32_MAX",
    "MAX_SPEC_BYTES",
    "NAME_PATTERN",
    "DynamicEvaluationStage",
    "SearchRange",
    "SpecError",
    "SpecIssue",
    "StudySpec",
    "is_character_level",
    "load_spec",
    "parse_spec",
    "read_spec",
    "spec_to_yaml",
]
