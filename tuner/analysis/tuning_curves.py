"""Tuning curves: how good each family's best validation loss gets after n tuning trials, n = 1 … N.

Two curves per family, from its complete tuning trials (interrupted, failed and pruned ones have no final
score and are left out), treated as independent draws from the configurations the sampler tries:
- the expected best (Dodge et al. 2019, "Show your work"): the expected minimum of n draws with replacement
  from the trials' empirical distribution, exact from the order statistics (opda's average tuning curve);
- the median best with its confidence band (Lourie et al. 2024, the `opda` package): the band comes from
  simultaneous, distribution-free bands on the score's CDF (Learned-Miller–DeStefano, equal-tailed), so it
  holds at every n at once. The expected best has no such band without a bound on the worst possible loss
  (and bootstrap bands of it cover far less than promised at large n: docs/usage.md), hence the median.
Where the trials cannot bound the band, its lower end is a loss of 0 (nothing is better) and its upper end
is infinite. Every family's band holds at once with probability `confidence`: each family's own band is at
confidence^(1/families), the families' trials being independent.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version

import numpy as np
from opda.nonparametric import EmpiricalDistribution
from sqlalchemy import select

from lm_tuner.tuner.analysis.curve_bands import BAND_METHOD, confidence_band
from lm_tuner.tuner.spec.units import Unit, unit_of
from lm_tuner.tuner.store.engine import sessions
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord

DEFAULT_CONFIDENCE = 0.95
CONFIDENCE_RANGE = (0.5, 0.999)  # beyond 0.999 the band's level rounds to 1 for several families (opda refuses)
CONFIDENCE_DECIMALS = 3  # a band is simulated and kept per confidence: 0.95 and 0.9500001 are one
METHOD = (f"expected best: Dodge et al. 2019 (exact, from the order statistics); band: of the median best, "
          f"simultaneous over n, distribution-free (opda {version('opda')}, {BAND_METHOD})")


@dataclass(frozen=True)
class CurvePoint:
    """The best validation loss after n trials (nats); `upper` is inf where the trials cannot bound it."""

    n: int
    expected_best: float
    median_best: float
    lower: float
    upper: float


@dataclass(frozen=True)
class FamilyCurve:
    family: str
    trials: int  # the complete tuning trials the curve is drawn from
    points: list[CurvePoint]
    expected_best_scores: list[float]  # the expected best in the study's unit (not the unit of expected_best)


@dataclass(frozen=True)
class TuningCurves:
    study: str
    unit: Unit
    confidence: float
    method: str
    families: list[FamilyCurve]
    verdict: str


def expected_best(values: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """Dodge et al.'s expected minimum of n draws with replacement from `values`, for each n in `ns`."""
    return np.asarray(EmpiricalDistribution(np.asarray(values, dtype=float)).average_tuning_curve(ns, minimize=True))


def family_curve(family: str, values: np.ndarray, confidence: float, unit: Unit) -> FamilyCurve:
    """The curves for n = 1 … len(values) (validation losses), with the median best's band at `confidence`."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1 (exclusive), not {confidence}")
    values = np.asarray(values, dtype=float)
    ns = np.arange(1, len(values) + 1)
    if len(values) == 0:
        return FamilyCurve(family, 0, [], [])
    low_cdf, point, high_cdf = confidence_band(values, confidence)
    median = point.quantile_tuning_curve(ns, minimize=True)
    ends = [high_cdf.quantile_tuning_curve(ns, minimize=True), low_cdf.quantile_tuning_curve(ns, minimize=True)]
    lower, upper = np.minimum(*ends), np.maximum(*ends)
    expected = expected_best(values, ns)
    points = [CurvePoint(int(n), float(e), float(m), float(lo), float(hi))
              for n, e, m, lo, hi in zip(ns, expected, median, lower, upper, strict=True)]
    # the expected best of the scores, not the score of the expected loss: the unit's scale is not linear
    return FamilyCurve(family, len(values), points, [float(s) for s in expected_best(unit.convert(values), ns)])


def verdict(curves: list[FamilyCurve], confidence: float) -> str:
    """Where one family's band lies wholly below every other's, in words; where none does, that the bands
    overlap."""
    drawn = [curve for curve in curves if curve.points]
    level = f"{confidence * 100:g}% confidence"
    if len(drawn) < 2:
        return "fewer than two families have complete tuning trials: nothing to compare yet"
    most = min(curve.trials for curve in drawn)
    leaders = [_leader(drawn, n) for n in range(1, most + 1)]
    spans = _spans(leaders)
    won = [(family, first, last) for family, first, last in spans if family is not None]
    if not won:
        return f"the bands overlap up to n = {most}: not enough trials to tell"
    sentences = []
    for family, first, last in won:
        sentences.append(f"{family} is better at {_where(first, last, most)} with {level}")
    overlap = [f"{first}" if first == last else f"{first}–{last}" for family, first, last in spans if family is None]
    if overlap:
        sentences.append(f"the bands overlap at n = {', '.join(overlap)}: not enough trials to tell there")
    return "; ".join(sentences) + f" (n up to {most}, the fewest complete trials of a family)"


def _where(first: int, last: int, most: int) -> str:
    if first == last:
        return f"n = {first}"
    if first == 1:
        return f"every n up to {last}"
    return f"every n ≥ {first}" if last == most else f"every n from {first} to {last}"


def _leader(curves: list[FamilyCurve], n: int) -> str | None:
    """The family whose band at n lies below every other family's, else None."""
    for curve in curves:
        upper = curve.points[n - 1].upper
        if all(upper < other.points[n - 1].lower for other in curves if other is not curve):
            return curve.family
    return None


def _spans(leaders: list[str | None]) -> list[tuple[str | None, int, int]]:
    """Runs of equal entries as (entry, first n, last n)."""
    spans: list[tuple[str | None, int, int]] = []
    for n, leader in enumerate(leaders, start=1):
        if spans and spans[-1][0] == leader:
            spans[-1] = (leader, spans[-1][1], n)
        else:
            spans.append((leader, n, n))
    return spans


def tuning_curves(url: str, name: str, confidence: float = DEFAULT_CONFIDENCE) -> TuningCurves | None:
    """The study's curves per family (in its order), or None for an unknown study; `confidence` is taken to
    CONFIDENCE_DECIMALS decimals."""
    confidence = round(confidence, CONFIDENCE_DECIMALS)
    if not CONFIDENCE_RANGE[0] <= confidence <= CONFIDENCE_RANGE[1]:
        raise ValueError(f"confidence must be in [{CONFIDENCE_RANGE[0]}, {CONFIDENCE_RANGE[1]}], not {confidence}")
    with sessions(url)() as session:
        spec = session.scalar(select(StudyRecord.spec).where(StudyRecord.name == name))
        if spec is None:
            return None
        rows = session.execute(select(TrialRecord.family, TrialRecord.value).where(
            TrialRecord.study_name == name, TrialRecord.stage == "tune", TrialRecord.state == "COMPLETE",
            TrialRecord.interrupted.is_(False), TrialRecord.value.is_not(None))).all()
    unit = unit_of(spec)
    families = list(spec["families"])
    each = confidence ** (1 / max(len(families), 1))  # all families' bands at once: `confidence`
    curves = []
    for family in families:
        values = np.array([value for trial_family, value in rows if trial_family == family], dtype=float)
        curves.append(family_curve(family, values, each, unit))
    return TuningCurves(name, unit, confidence, METHOD, curves, verdict(curves, confidence))
