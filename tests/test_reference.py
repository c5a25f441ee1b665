"""The spec reference page documents every field and stays in sync with the code."""

from __future__ import annotations

from pathlib import Path

from lm_tuner.tuner.spec.hyperparameters import HYPERPARAMETERS
from lm_tuner.tuner.spec.reference import SECTIONS, render

PAGE = Path(__file__).parent.parent / "docs" / "spec.md"


def test_committed_reference_is_current():
    assert PAGE.read_text() == render(), "regenerate it: python -m lm_tuner.tuner.spec.reference > docs/spec.md"


def test_every_field_and_hyperparameter_is_documented():
    page = render()
    for _, model, _ in SECTIONS:
        for name in model.model_fields:
            assert f"| `{name}` |" in page
    for name in HYPERPARAMETERS:
        assert f"| `{name}` |" in page
