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

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={  # each name's module in this package
    "document": [
        "DYNAMIC_EVALUATION_KINDS", "INT32_MAX", "MAX_SPEC_BYTES", "NAME_PATTERN", "DynamicEvaluationStage",
        "SearchRange", "StudySpec", "spec_to_yaml",
    ],
    "units": ["is_character_level"],
    "issues": ["SpecError", "SpecIssue"],
    "validation": ["load_spec", "parse_spec", "read_spec"],
})
