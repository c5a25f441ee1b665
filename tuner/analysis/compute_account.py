"""Each family's best validation loss at equal training tokens and at equal compute, read from the study's compute
account (docs/methodology.md, "The comparison at equal budgets").

A family's account is every turn of its tuning trials, whatever became of them (running, pruned, failed and
interrupted trials spent what they reported), in the order the controller recorded them (`reported_at`). After each
turn the family has spent, on each axis, the sum over its trials of the most each had reported by then (training
tokens; device-seconds: CPU core-seconds, or GPU-seconds), and its best so far is the lowest validation loss any of
those turns scored.

The equal point of an axis is the least any family has spent on it. A family is credited with the turns it reported
while its spend was at most EQUAL_WITHIN above that point, and its best at the equal point is the best of those
turns: no family is credited with more than 5% beyond what the least-spending family got, and families that spent
within 5% of each other (as a study's budget split aims for) are compared whole. Trials still running count with
the turns they have reported: the point moves as they report, and every number is provisional until the study ends.
Turns recorded before the account was kept have no tokens or device-seconds: that axis is then unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import select

from lm_tuner.tuner.store.engine import reading, retried_on_disconnect
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord, TurnRecord

EQUAL_WITHIN = 0.05
"""A family whose spend is within this share above the least family's is credited with all of it."""

Axis = Literal["tokens", "compute"]
AXES: tuple[Axis, ...] = ("tokens", "compute")


@dataclass(frozen=True)
class TurnRow:
    """One turn of a tuning trial as the account reads it; tokens and compute_seconds are the trial's so far."""

    family: str
    trial_id: int
    turn: int
    tokens: int | None
    compute_seconds: float | None
    reported_at: datetime | None
    val_loss: float


@dataclass(frozen=True)
class Spend:
    """A family's account after one of its turns: what it had spent on each axis (None: not recorded) and the
    lowest validation loss so far (None until a turn scored a finite one)."""

    tokens: float | None
    compute: float | None
    best_loss: float | None


@dataclass(frozen=True)
class FamilyAccount:
    family: str
    spends: list[Spend]  # one per turn, in the order they were recorded

    def known(self, axis: Axis) -> bool:
        """Whether every turn recorded what it spent on `axis` (turns recorded before the account was kept did
        not)."""
        return all(getattr(spend, axis) is not None for spend in self.spends)

    def total(self, axis: Axis) -> float | None:
        """What the family has spent on `axis` so far (0 before its first turn), None where unknown."""
        if not self.known(axis):
            return None
        return getattr(self.spends[-1], axis) if self.spends else 0.0

    def best_within(self, axis: Axis, limit: float) -> float | None:
        """The lowest validation loss of the turns reported while the family's spend on `axis` was within
        `limit`."""
        best = None
        for spend in self.spends:
            if getattr(spend, axis) > limit:
                break
            best = spend.best_loss
        return best

    @property
    def tokens_per_second(self) -> float | None:
        """Training tokens per device-second (CPU core-second or GPU-second) over the whole account."""
        tokens, seconds = self.total("tokens"), self.total("compute")
        return tokens / seconds if tokens is not None and seconds else None


@dataclass(frozen=True)
class EqualBudget:
    """The families at the equal point of one axis."""

    axis: Axis
    point: float | None  # the least any family spent on the axis; None where some family's spend is unknown
    best: dict[str, float | None]  # each family's lowest validation loss (nats) within the point
    winner: str | None  # lowest of them, named where the study compares families and every one has a score
    none_because: str | None  # why no winner is named, where none is


@dataclass(frozen=True)
class StudyAccount:
    compute_unit: str  # "CPU core-seconds" or "GPU-seconds"
    families: list[FamilyAccount]  # in the study's order
    tokens: EqualBudget
    compute: EqualBudget

    def at(self, axis: Axis) -> EqualBudget:
        return self.tokens if axis == "tokens" else self.compute


def compute_unit(spec: dict) -> str:
    """What a study's device-seconds are: GPU-seconds (wall seconds times GPUs held) for trials on GPUs, else CPU
    core-seconds (the training process's CPU time)."""
    return "GPU-seconds" if (spec.get("resources") or {}).get("gpus_per_trial", 0) > 0 else "CPU core-seconds"


@retried_on_disconnect
def study_account(url: str, name: str) -> StudyAccount | None:
    """The study's account per family, and the families at each equal point; None for an unknown study."""
    with reading(url) as connection:
        spec = connection.scalar(select(StudyRecord.spec).where(StudyRecord.name == name))
        if spec is None:
            return None
        rows = [TurnRow(*row) for row in connection.execute(
            select(TrialRecord.family, TurnRecord.trial_id, TurnRecord.turn, TurnRecord.tokens,
                   TurnRecord.compute_seconds, TurnRecord.reported_at, TurnRecord.val_loss)
            .join(TrialRecord, TrialRecord.trial_id == TurnRecord.trial_id)
            .where(TrialRecord.study_name == name, TrialRecord.stage == "tune"))]
    return account_of(list(spec["families"]), rows, compute_unit(spec))


def account_of(families: list[str], rows: Iterable[TurnRow], unit: str) -> StudyAccount:
    """The account of `families` from their tuning turns (in any order)."""
    ordered = sorted(rows, key=lambda row: (row.reported_at is None, row.reported_at or datetime.min, row.trial_id,
                                            row.turn))
    accounts = [FamilyAccount(family, _spends([row for row in ordered if row.family == family]))
                for family in families]
    return StudyAccount(unit, accounts, *(equal_budget(accounts, axis) for axis in AXES))


def _spends(rows: list[TurnRow]) -> list[Spend]:
    """A family's spend and best so far after each of its turns; a turn without its record of an axis (or of when it
    was recorded, which orders them) leaves that axis unknown from then on."""
    most: dict[Axis, dict[int, float]] = {axis: {} for axis in AXES}
    known = {axis: True for axis in AXES}
    best, spends = None, []
    for row in rows:
        for axis, value in (("tokens", row.tokens), ("compute", row.compute_seconds)):
            known[axis] = known[axis] and value is not None and row.reported_at is not None
            if known[axis]:  # the most a trial reported: a resumed trial counts on from its checkpoint
                most[axis][row.trial_id] = max(most[axis].get(row.trial_id, 0.0), float(value))
        if math.isfinite(row.val_loss) and (best is None or row.val_loss < best):
            best = row.val_loss
        spends.append(Spend(*(sum(most[axis].values()) if known[axis] else None for axis in AXES), best))
    return spends


def equal_budget(accounts: list[FamilyAccount], axis: Axis) -> EqualBudget:
    """The families at the least spend of any on `axis`, each credited up to EQUAL_WITHIN above it."""
    unknown = [account.family for account in accounts if not account.known(axis)]
    if unknown:
        return EqualBudget(axis, None, {account.family: None for account in accounts}, None,
                           f"{', '.join(unknown)} recorded turns without it (before the compute account was kept)")
    point = min(account.total(axis) for account in accounts)  # a spec names one family or more
    best = {account.family: account.best_within(axis, point * (1 + EQUAL_WITHIN)) for account in accounts}
    if len(accounts) < 2:
        return EqualBudget(axis, point, best, None, "one family: nothing to compare")
    silent = [family for family, loss in best.items() if loss is None]
    if silent:
        return EqualBudget(axis, point, best, None, f"{', '.join(silent)} scored no validation loss within it")
    return EqualBudget(axis, point, best, min(best, key=best.get), None)
