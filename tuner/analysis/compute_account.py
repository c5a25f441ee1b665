"""Each family's best validation loss at equal training tokens and at equal compute, read from the study's compute
account (docs/methodology.md, "The comparison", equal budgets).

A family's account is every turn of its tuning trials, whatever became of them (running, pruned, failed and
interrupted trials spent what they reported), in the order the controller recorded them (their ids). After each
turn the family has spent, on each axis, the sum over its trials of the most each had reported by then (training
tokens; device-seconds: CPU core-seconds, or GPU-seconds), and its best so far is the lowest validation loss any of
those turns scored.

The equal point of an axis is the least any family has spent on it. A family is credited with the turns it reported
while its spend was at most EQUAL_WITHIN above that point, and its best at the equal point is the best of those
turns: no family is credited with more than 5% beyond what the least-spending family got, and families that spent
within 5% of each other (as a study's budget split aims for) are compared whole. Trials still running count with
the turns they have reported: the point moves as they report, and every number is provisional until the study ends.
Turns recorded before the account was kept have no tokens or device-seconds: that axis is then unknown.

The account is kept in memory per study and brought up to date with the turns recorded since (by their ids, which
follow the order the controller recorded them): a page refreshed while a study runs reads a few new turns, not every
turn of thousands of trials. A turn reported again (a trial retried from its checkpoint) rebuilds it from the start.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select

from lm_tuner.tuner.store.engine import reading, retried_on_disconnect
from lm_tuner.tuner.store.schema import StudyRecord, TrialRecord, TurnRecord

EQUAL_WITHIN = 0.05
"""A family whose spend is within this share above the least family's is credited with all of it."""

Axis = Literal["tokens", "compute"]
AXES: tuple[Axis, ...] = ("tokens", "compute")

@dataclass(frozen=True)
class Spend:
    """A family's account after one of its turns: what it had spent on each axis and the lowest validation loss so far
    (None until a turn scored a finite one)."""

    tokens: float
    compute: float
    best_loss: float | None


@dataclass(frozen=True)
class FamilyAccount:
    family: str
    corners: list[Spend]  # the turns where its best so far improved, then its last turn, in the order recorded
    unknown: frozenset[Axis] = frozenset()  # axes some of its turns did not record (before the account was kept)

    def known(self, axis: Axis) -> bool:
        return axis not in self.unknown

    def total(self, axis: Axis) -> float | None:
        """What the family has spent on `axis` so far (0 before its first turn), None where unknown."""
        if not self.known(axis):
            return None
        return getattr(self.corners[-1], axis) if self.corners else 0.0

    def best_within(self, axis: Axis, limit: float) -> float | None:
        """The lowest validation loss of the turns reported while the family's spend on `axis` was within `limit`."""
        best = None
        for corner in self.corners:
            if getattr(corner, axis) > limit:
                break
            best = corner.best_loss
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


def compute_unit(spec: dict) -> str:
    """What a study's device-seconds are: GPU-seconds (wall seconds times GPUs held) for trials on GPUs, else CPU
    core-seconds (the training process's CPU time)."""
    return "GPU-seconds" if (spec.get("resources") or {}).get("gpus_per_trial", 0) > 0 else "CPU core-seconds"


@retried_on_disconnect
def study_account(url: str, name: str) -> StudyAccount | None:
    """The study's account per family, and the families at each equal point; None for an unknown study."""
    with reading(url) as connection:
        study = connection.execute(select(StudyRecord.id, StudyRecord.spec).where(StudyRecord.name == name)).first()
        if study is None:
            return None
        with _LOCK:
            ledger = _LEDGERS.pop((url, study.id), None) or _StudyLedger(study.spec["families"])
            rows = connection.execute(_turns_after(name, ledger.last_id)).all()
            # a turn reported again is a row written anew: after the last one seen, or in its place (SQLite gives a
            # new row the id of the highest row deleted just before)
            if ledger.last_id and (any(row.turn <= ledger.turns.get(row.trial_id, 0) for row in rows)
                                   or connection.execute(_turn(ledger.last_id)).first() != ledger.last_row):
                ledger = _StudyLedger(study.spec["families"])
                rows = connection.execute(_turns_after(name, 0)).all()
            ledger.add(rows)
            _LEDGERS[(url, study.id)] = ledger
            while len(_LEDGERS) > _KEPT:
                _LEDGERS.popitem(last=False)
            accounts = ledger.accounts()
    return StudyAccount(compute_unit(study.spec), accounts, *(equal_budget(accounts, axis) for axis in AXES))


_COLUMNS = (TurnRecord.id, TurnRecord.trial_id, TurnRecord.turn, TurnRecord.tokens, TurnRecord.compute_seconds,
            TurnRecord.val_loss)


def _turns_after(name: str, last_id: int):
    """The study's tuning turns recorded after the turn with id `last_id`, in the order recorded."""
    return (select(TrialRecord.family, *_COLUMNS)
            .join(TrialRecord, TrialRecord.trial_id == TurnRecord.trial_id)
            .where(TurnRecord.id > last_id, TrialRecord.study_name == name, TrialRecord.stage == "tune")
            .order_by(TurnRecord.id))


def _turn(turn_id: int):
    return select(*_COLUMNS).where(TurnRecord.id == turn_id)


class _FamilyLedger:
    """One family's account as its turns are added in the order recorded."""

    def __init__(self) -> None:
        self.most_tokens: dict[int, float] = {}  # the most each trial reported
        self.most_seconds: dict[int, float] = {}
        self.tokens = self.seconds = 0.0
        self.unknown: set[Axis] = set()
        self.best: float | None = None
        self.corners: list[Spend] = []  # where the best improved
        self.turns = 0

    def add(self, trial_id: int, tokens: int | None, seconds: float | None, loss: float) -> None:
        # a resumed trial counts on from the most it reported, not again from its checkpoint
        if tokens is None:
            self.unknown.add("tokens")
        elif tokens > (before := self.most_tokens.get(trial_id, 0)):
            self.most_tokens[trial_id], self.tokens = tokens, self.tokens + tokens - before
        if seconds is None:
            self.unknown.add("compute")
        elif seconds > (before := self.most_seconds.get(trial_id, 0.0)):
            self.most_seconds[trial_id], self.seconds = seconds, self.seconds + seconds - before
        if (self.best is None or loss < self.best) and math.isfinite(loss):
            self.best = loss
            self.corners.append(Spend(float(self.tokens), float(self.seconds), loss))
        self.turns += 1

    def account(self, family: str) -> FamilyAccount:
        last = Spend(float(self.tokens), float(self.seconds), self.best)
        ends = [last] if self.turns and (not self.corners or self.corners[-1] != last) else []
        return FamilyAccount(family, [*self.corners, *ends], frozenset(self.unknown))


class _StudyLedger:
    def __init__(self, families: list[str]) -> None:
        self.last_id = 0
        self.last_row: tuple | None = None  # the last turn added, as _turn reads it
        self.turns: dict[int, int] = {}  # the latest turn of each trial added
        self.families = {family: _FamilyLedger() for family in families}

    def add(self, rows) -> None:
        families, turns = self.families, self.turns
        for family, _, trial_id, turn, tokens, seconds, loss in rows:
            families[family].add(trial_id, tokens, seconds, loss)
            turns[trial_id] = turn
        if rows:
            self.last_row = tuple(rows[-1][1:])
            self.last_id = self.last_row[0]

    def accounts(self) -> list[FamilyAccount]:
        return [ledger.account(family) for family, ledger in self.families.items()]


_LOCK = threading.Lock()
_LEDGERS: OrderedDict[tuple[str, int], _StudyLedger] = OrderedDict()  # by database and study, least recent first
_KEPT = 16  # studies whose account is kept


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
        return EqualBudget(axis, point, best, None, f"{', '.join(silent)} had no validation score by then")
    return EqualBudget(axis, point, best, min(best, key=best.get), None)
