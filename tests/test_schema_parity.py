"""The API's comparison and spec-error models are written out by hand beside the tuner dataclasses they serve
(`ComparisonOut.model_validate(asdict(comparison))`): a field added to one side only would be dropped silently
or fail only at request time. Here the field sets must agree, apart from fields the API adds on purpose."""

from __future__ import annotations

import dataclasses

import pytest

from lm_tuner.api import schemas
from lm_tuner.tuner.analysis.comparison import Comparison, Estimate, FamilyResult, Lineage
from lm_tuner.tuner.analysis.study_facts import Baseline
from lm_tuner.tuner.spec.issues import SpecIssue
from lm_tuner.tuner.store import BaselineOut

PAIRS = [
    (schemas.ComparisonOut, Comparison),
    (schemas.FamilyResultOut, FamilyResult),
    (schemas.EstimateOut, Estimate),
    (schemas.LineageOut, Lineage),
    (schemas.SpecIssueOut, SpecIssue),
    (BaselineOut, Baseline),
]
# Fields that exist only on the API side, on purpose; each with the reason. A response field filled in by the
# route (not by the tuner's dataclass) belongs here, so the test still fails on one forgotten by accident.
API_ONLY: dict[type, dict[str, str]] = {
    schemas.ComparisonOut: {"unigram_baseline": "the route takes it from the study (study_facts.study_baseline), "
                                                "as `tuner compare` does; the comparison is read from its trials",
                            "no_better_than_baseline": "a judgement against that baseline (comparison_document), "
                                                       "not read from the trials"},
}
# Dataclass fields the API leaves out on purpose; each with the reason.
TUNER_ONLY: dict[type, dict[str, str]] = {}


@pytest.mark.parametrize(("model", "dataclass"), PAIRS, ids=lambda kind: kind.__name__)
def test_the_api_model_has_the_dataclass_fields(model, dataclass):
    api_fields = _field_names(model) - set(API_ONLY.get(model, {}))
    tuner_fields = _field_names(dataclass) - set(TUNER_ONLY.get(dataclass, {}))
    assert api_fields == tuner_fields, (
        f"{model.__name__} lacks {sorted(tuner_fields - api_fields)} and adds {sorted(api_fields - tuner_fields)} "
        f"against {dataclass.__module__}.{dataclass.__name__}: add the field to both, or list it in API_ONLY or "
        f"TUNER_ONLY with the reason")


@pytest.mark.parametrize("exceptions", [API_ONLY, TUNER_ONLY], ids=["api_only", "tuner_only"])
def test_every_exception_names_a_real_field_and_a_reason(exceptions):
    for kind, fields in exceptions.items():
        present = _field_names(kind)
        assert set(fields) <= present, f"{kind.__name__} has no field {sorted(set(fields) - present)}"
        assert all(reason.strip() for reason in fields.values()), f"{kind.__name__}: give each exception a reason"


def _field_names(kind: type) -> set[str]:
    return set(kind.model_fields) if hasattr(kind, "model_fields") else {f.name for f in dataclasses.fields(kind)}
