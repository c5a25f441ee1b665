"""The result of a study as a comparison of its families: the Table 2.1 of the paper, from the database.

Per family: the best tuning run, then — over the final models (the reruns with new seeds, else the
best tuning run) — validation and test with and without Monte-Carlo dropout and dynamic
evaluation, as mean ± standard deviation. The winner is the family with the lowest mean validation
score of its final models, never the luckiest single run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from sqlalchemy import select

from lm_tuner.tuner.run.stages import final_trials, top_trials
from lm_tuner.tuner.spec import StudySpec
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import EvaluationRecord, StudyRecord, TrialRecord

KINDS = ("deterministic", "mc", "dynamic", "dynamic_mc")


@dataclass(frozen=True)
class Estimate:
    mean: float
    std: float  # sample standard deviation; 0 for a single value
    count: int


@dataclass(frozen=True)
class Lineage:
    """Which stage-2 trial's settings gave a checkpoint's dynamic-evaluation result."""

    checkpoint_trial_id: int
    dyneval_trial_id: int | None
    settings: dict


@dataclass(frozen=True)
class FamilyResult:
    family: str
    complete_tuning_trials: int
    best_tuning: float | None
    final_trial_ids: list[int]
    valid: Estimate | None = None
    test: Estimate | None = None
    mc_valid: Estimate | None = None
    mc_test: Estimate | None = None
    dynamic_valid: Estimate | None = None
    dynamic_test: Estimate | None = None
    lineage: list[Lineage] = field(default_factory=list)


@dataclass(frozen=True)
class Comparison:
    study: str
    unit: str  # "perplexity" (words) or "bpc" (characters)
    families: list[FamilyResult]
    winner: str | None
    winner_by: str


def comparison(url: str, name: str) -> Comparison | None:
    with sessions(url)() as session:
        spec_data = session.scalar(select(StudyRecord.spec).where(StudyRecord.name == name))
    if spec_data is None:
        return None
    spec = StudySpec.model_validate(spec_data)
    convert = _bits_per_character if spec.character_level else math.exp
    results = [_family_result(url, spec, family, convert) for family in spec.families]
    by_reruns = spec.reruns is not None
    scored = [(r.valid.mean, r.family) for r in results if r.valid is not None]
    winner = min(scored)[1] if scored else None
    if by_reruns:
        winner_by = f"mean validation {'bpc' if spec.character_level else 'perplexity'} of the reruns"
    else:
        winner_by = "validation score of the best tuning run (no reruns in the spec)"
    return Comparison(name, "bpc" if spec.character_level else "perplexity", results, winner, winner_by)


def _family_result(url: str, spec: StudySpec, family: str, convert) -> FamilyResult:
    finals = final_trials(url, spec, family)
    best = top_trials(url, spec.name, family, "tune", 1)
    with sessions(url)() as session:
        complete = len(session.scalars(select(TrialRecord.trial_id).where(
            TrialRecord.study_name == spec.name, TrialRecord.family == family, TrialRecord.stage == "tune",
            TrialRecord.state == "COMPLETE")).all())
        evaluations = session.scalars(select(EvaluationRecord).where(
            EvaluationRecord.trial_id.in_([t.trial_id for t in finals]))).all()
    by_kind: dict[str, list[EvaluationRecord]] = {kind: [] for kind in KINDS}
    for evaluation in evaluations:
        by_kind[evaluation.kind].append(evaluation)
    estimates = {}
    for kind, prefix in (("deterministic", ""), ("mc", "mc_"), ("dynamic", "dynamic_")):
        records = by_kind[kind]
        estimates[f"{prefix}valid"] = _estimate([convert(r.valid_loss) for r in records])
        estimates[f"{prefix}test"] = _estimate([convert(r.test_loss) for r in records])
    if estimates["valid"] is None:  # no test protocol: the training-time validation scores
        estimates["valid"] = _estimate([convert(t.value) for t in finals if t.value is not None])
    lineage = [Lineage(r.trial_id, r.dyneval_trial_id, r.settings.get("dynamic_evaluation", {}))
               for r in by_kind["dynamic"]]
    return FamilyResult(family, complete, convert(best[0].value) if best else None,
                        [t.trial_id for t in finals], lineage=lineage, **estimates)


def _estimate(values: list[float]) -> Estimate | None:
    if not values:
        return None
    return Estimate(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values))


def _bits_per_character(loss: float) -> float:
    return loss / math.log(2)
