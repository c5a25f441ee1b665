"""Tuning curves over REST: per family, the expected best score after n = 1 … N trials with a confidence band,
the method, and the verdict in words (tuner/analysis/tuning_curves.py says how they are computed)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, Field

from lm_tuner.api.deps import Reader, SettingsDep, Unauthorized
from lm_tuner.api.params import StudyName
from lm_tuner.dashboards import figure_json
from lm_tuner.dashboards.tuning_curves import tuning_curves_figure
from lm_tuner.tuner.analysis.tuning_curves import (
    CONFIDENCE_DECIMALS,
    CONFIDENCE_RANGE,
    DEFAULT_CONFIDENCE,
    FamilyCurve,
    TuningCurves,
    tuning_curves,
)

router = APIRouter(tags=["plots"], dependencies=[Reader])


class CurveRow(BaseModel):
    n: int = Field(description="trials")
    expected_best: float = Field(description="expected best validation loss (nats) after n trials (Dodge et al.)")
    median_best: float = Field(description="median best validation loss (nats) after n trials")
    lower: float = Field(description="the band's lower end (nats); 0 where the trials cannot bound it")
    upper: float | None = Field(description="the band's upper end (nats); null where the trials cannot bound it")
    expected_best_score: float = Field(description="expected best score after n trials, in the study's unit")
    median_best_score: float
    lower_score: float
    upper_score: float | None


class FamilyCurveOut(BaseModel):
    family: str
    trials: int = Field(description="the complete tuning trials the curve is drawn from")
    rows: list[CurveRow]


class TuningCurvesOut(BaseModel):
    study: str
    unit: str = Field(description="the unit of the *_score fields: perplexity or bpc")
    confidence: float = Field(description="the probability that every family's band holds at once (as asked, to "
                                          f"{CONFIDENCE_DECIMALS} decimals)")
    method: str
    verdict: str
    families: list[FamilyCurveOut]
    figure: dict[str, Any]


Confidence = Annotated[float, Query(ge=CONFIDENCE_RANGE[0], le=CONFIDENCE_RANGE[1], allow_inf_nan=False,
                                    description=f"confidence of the bands, from 0.5 to 0.999, taken to "
                                                f"{CONFIDENCE_DECIMALS} decimals (the answer's `confidence`)")]


@router.get("/studies/{name}/tuning-curves", response_model=TuningCurvesOut,
            responses={404: {"description": "no such study"}, **Unauthorized})
def read_tuning_curves(name: StudyName, config: SettingsDep, confidence: Confidence = DEFAULT_CONFIDENCE
                       ) -> TuningCurvesOut:
    """Per family, the expected best validation score after n = 1 … N complete tuning trials, the median
    best with its band (all families' bands hold at once with probability `confidence`), and which family is
    better at which n with that confidence."""
    found = tuning_curves(config.storage_url, name, confidence)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no study named {name!r}")
    return TuningCurvesOut(study=name, unit=found.unit.name, confidence=found.confidence, method=found.method,
                           verdict=found.verdict, families=[_family(found, c) for c in found.families],
                           figure=figure_json(tuning_curves_figure(found)))


def _family(found: TuningCurves, curve: FamilyCurve) -> FamilyCurveOut:
    unit = found.unit
    return FamilyCurveOut(family=curve.family, trials=curve.trials, rows=[
        CurveRow(n=p.n, expected_best=p.expected_best, median_best=p.median_best, lower=p.lower,
                 upper=_finite(p.upper), expected_best_score=score, median_best_score=unit.of(p.median_best),
                 lower_score=unit.of(p.lower), upper_score=_finite(unit.of(p.upper)))
        for p, score in zip(curve.points, curve.expected_best_scores, strict=True)])


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
